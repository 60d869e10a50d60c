"""Today's models in the analytic planner: explicit head sizes, MLA, MTP, dense and MoE blocks per index, MoE load,
sliding windows; the shipped Qwen3, GPT-OSS, Mixtral and DeepSeek-V3 files; through the API and `stagewise plan`."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stagewise.plan.cluster import kept_bytes
from stagewise.plan.cluster import Compute, ExpertParallel, TensorParallel, analytic_profile, block_activation_bytes
from stagewise.plan.cluster import SpecError
from stagewise.plan.cluster import Hardware
from stagewise.plan.cluster import TransformerSpec

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402

H100 = Hardware.load("h100")
DSV3 = TransformerSpec.load("deepseek-v3")
#: a Qwen3-like file: head size 128 with hidden 2048 (32 query heads are 4,096 wide), 4 KV heads, 8 experts
QWENISH = {"format": "stagewise-model", "version": 1, "name": "qwenish", "layers": 8, "hidden": 2048, "heads": 32,
           "kv_heads": 4, "head_dim": 128, "ffn": 6144, "vocab": 32000, "seq": 1024, "mlp": "swiglu",
           "moe": {"experts": 8, "top_k": 2, "expert_ffn": 768}}


def write(tmp_path, data, name="m.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("name, billions", [("qwen3-8b", 8.19), ("qwen3-32b", 32.8), ("qwen3-30b-a3b", 30.5),
                                            ("qwen3-235b-a22b", 235.1), ("gpt-oss-20b", 20.9),
                                            ("gpt-oss-120b", 116.8), ("mixtral-8x7b", 46.7),
                                            ("mixtral-8x22b", 140.6)])
def test_the_shipped_files_count_what_their_sources_say(name, billions):
    spec = TransformerSpec.load(name)
    assert spec.params() / 1e9 == pytest.approx(billions, rel=0.005)


def test_an_explicit_head_size_sets_the_attention_widths():
    q = TransformerSpec.load("qwen3-30b-a3b")
    assert (q.head_size, q.q_dim, q.kv_dim, q.hidden) == (128, 4096, 512, 2048)
    assert q.attention_params() == 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 2048
    assert q.attention_flops(1) == 2 * q.seq * (4096 + 4096)  # Q K^T and scores x V over 32 heads of 128
    assert q.moe_layers == 48 and q.block_kind(0) == "m"
    # the kept queries and output-projection input are 4,096 wide, the keys and values 512
    per_token = kept_bytes(q, "m", 1, 1, True) - kept_bytes(replace(q, head_dim=64), "m", 1, 1, True)
    assert per_token == 2 * (2048 + 256 + 256 + 2048)


def test_a_hidden_that_is_no_multiple_of_the_heads_needs_head_dim(tmp_path):
    bad = {k: v for k, v in QWENISH.items() if k != "head_dim"} | {"hidden": 2050}
    with pytest.raises(SpecError, match=r"hidden \(2050\) must be a multiple of heads \(32\), or give head_dim"):
        TransformerSpec.load(write(tmp_path, bad))
    assert TransformerSpec.load(write(tmp_path, {**bad, "head_dim": 64})).q_dim == 2048


def test_mla_is_costed_as_mla():
    """DeepSeek-V3's attention: 187M weights a layer (q 7168 -> 1536 -> 128 x 192, kv 7168 -> 512 + 64 -> 128 x
    256, output 128 x 128 -> 7168), query-key heads of 192 and value heads of 128 in the attention products, the
    down-projections whole on every tensor-parallel GPU, the up-projected queries, keys and values dropped by
    mla_up_proj recomputation at the price of the up-projections' multiplies once more in I."""
    assert DSV3.attention_params() == pytest.approx(187.12e6, rel=1e-4)
    assert DSV3.attention_flops(1) == 2 * 4096 * 128 * (192 + 128)
    one, two = (analytic_profile(DSV3, H100, TensorParallel(t=t), (1,)).layers[1] for t in (1, 2))
    down = 7168 * (1536 + 512 + 64) + 1536 + 512  # the latents' projections and norms, held whole
    assert one.param_bytes - 2 * two.param_bytes == -2 * down
    sel = Compute(modules=("mla_up_proj",))
    off, up = (analytic_profile(DSV3, H100, TensorParallel(t=1), (1,), recompute=rc, compute=sel).layers[1]
               for rc in ("off", "selective"))
    qkv = 2 * 4096 * 128 * (192 + 192 + 128)
    assert off.activation_bytes[0] - up.activation_bytes[0] == qkv
    assert up.t_i[0] - off.t_i[0] == pytest.approx(DSV3.up_projection_flops(4096) / H100.rate)
    assert up.t_f[0] == off.t_f[0] and up.t_w[0] == off.t_w[0]


def test_the_mtp_module_rides_with_the_head():
    no_mtp = replace(DSV3, mtp_layers=0)
    with_, without = (analytic_profile(s, H100, TensorParallel(t=1), (1,), expert=ExpertParallel(ep=8)).layers[-1]
                      for s in (DSV3, no_mtp))
    assert with_.symbol == without.symbol == "H"
    assert with_.param_bytes > without.param_bytes and with_.expert_param_bytes > 0  # its MoE block's experts
    assert with_.t_f[0] > 2 * without.t_f[0] and with_.a2a and not without.a2a
    assert DSV3.model_flops_per_token() > no_mtp.model_flops_per_token()
    assert DSV3.params() - no_mtp.params() == DSV3.mtp_params()


def test_dense_and_moe_blocks_per_index(tmp_path):
    moe = {**QWENISH["moe"], "dense_layers": 1, "every": 2, "dense": [5]}
    spec = TransformerSpec.load(write(tmp_path, {**QWENISH, "moe": moe}))
    assert [spec.block_kind(i) for i in range(8)] == ["t", "m", "t", "m", "t", "t", "t", "m"]
    prof = analytic_profile(spec, H100, TensorParallel(t=1), (1,))
    assert prof.symbols == ("E", "t", "m", "t", "m", "t", "t", "t", "m", "H")
    assert spec.moe_layers == 3


def test_moe_load_scales_the_busiest_ranks_experts_and_all_to_all(tmp_path):
    base = TransformerSpec.load(write(tmp_path, QWENISH))
    loaded = replace(base, moe=replace(base.moe, imbalance=1.5))
    capped = replace(base, moe=replace(base.moe, imbalance=1.5, capacity_factor=1.25))
    padded = replace(base, moe=replace(base.moe, capacity_factor=1.25, pad=True))
    assert (loaded.moe.load, capped.moe.load, padded.moe.load) == (1.5, 1.25, 1.25)
    ep = ExpertParallel(ep=4)
    b, lo = (analytic_profile(s, H100, TensorParallel(t=1), (1,), expert=ep).layers[1] for s in (base, loaded))
    assert lo.a2a[0] == pytest.approx(1.5 * b.a2a[0]) and lo.t_w[0] > b.t_w[0]
    assert lo.activation_bytes[0] > b.activation_bytes[0]


def test_sliding_window_blocks_attend_to_their_window():
    oss = TransformerSpec.load("gpt-oss-120b")
    assert oss.sliding(0) and not oss.sliding(1) and oss.sliding_window == 128
    assert oss.attention_flops(1, 0) == oss.attention_flops(1, 1) * 256 / oss.seq
    prof = analytic_profile(oss, H100, TensorParallel(t=1), (1,))
    assert prof.layers[1].t_f[0] < prof.layers[2].t_f[0]  # block 0 slides, block 1 sees the whole sequence


@pytest.mark.parametrize("change, words", [
    ({"head_size": 64}, "unknown field 'head_size'"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types must be a list of 8 entries"),
    ({"layer_types": ["sliding_attention"] * 8}, "give sliding_window"),
    ({"mla": {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "rank": 1}},
     "unknown field 'rank'"),
    ({"mla": {"kv_lora_rank": 512}}, "lacks the field 'qk_rope_head_dim'"),
    ({"moe": {**QWENISH["moe"], "pad": True}}, "pad pads every expert to its capacity: give capacity_factor"),
    ({"moe": {**QWENISH["moe"], "imbalance": 0.5}}, "imbalance must be >= 1"),
    ({"moe": {**QWENISH["moe"], "every": 0}}, "every must be > 0"),
    ({"moe": {**QWENISH["moe"], "dense": [9]}}, "dense must be a list of block indices from 0 to 7"),
    ({"moe": {**QWENISH["moe"], "dense": list(range(8))}}, "no block is MoE"),
    ({"mtp_layers": -1}, "mtp_layers must be >= 0"),
])
def test_bad_model_fields_are_named(tmp_path, change, words):
    with pytest.raises(SpecError, match="--model") as e:
        TransformerSpec.load(write(tmp_path, {**QWENISH, **change}))
    assert words in str(e.value)


def test_plan_qwen3_30b_a3b_and_a_head_dim_file(tmp_path, capsys):
    """The acceptance: `plan --model qwen3-30b-a3b` plans, and so does a file with head size 128 and hidden 2048."""
    rc, out, err = run(capsys, "plan", "--model", "qwen3-30b-a3b", "--hardware", "h100", "--gpus", "16",
                       "--global-batch-tokens", "512K", "--schedules", "1f1b", "--tensor", "1", "--pipeline", "2",
                       "--micro-batch-sizes", "1", "--expert", "8", "--json", "-o", str(tmp_path / "q.csv"))
    assert rc == 0, err
    best = json.loads(out)["best"]
    assert best["ep"] == 8 and best["fits"] and best["p"] == 2
    rc, out, err = run(capsys, "plan", "--model", write(tmp_path, QWENISH), "--hardware", "h100", "--gpus", "8",
                       "--global-batch-tokens", "64K", "--schedules", "1f1b", "-o", str(tmp_path / "w.csv"))
    assert rc == 0, err and "qwenish on 8 x h100" in out
