"""Precision, overlapped tensor parallel, recomputation by module kind, any v, the step overhead and the memory band
of a cluster plan: each by the hardware file's factors, through the API and `stagewise plan`."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stagewise.plan.cluster import Compute, TensorParallel, analytic_profile, block_activation_bytes, tp_allreduce_time
from stagewise.plan.cluster import Job, cluster_search
from stagewise.plan.cluster import SpecError
from stagewise.plan.errors import PlanError
from stagewise.plan.cluster import Hardware
from stagewise.plan.search import Space
from stagewise.plan.cluster import TransformerSpec

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402

H100 = Hardware.load("h100")
A100 = Hardware.load("a100")
LLAMA = TransformerSpec.load("llama3-8b")
FIXED = ("plan", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "16", "--global-batch-tokens", "1M",
         "--tensor", "2", "--pipeline", "2", "--schedules", "1f1b", "--micro-batch-sizes", "1", "--recompute", "off",
         "--framework", "megatron")


def test_fp8_runs_the_linear_layers_at_the_hardware_files_rate_and_keeps_their_inputs_in_fp8():
    tp = TensorParallel(t=2)
    bf16, fp8 = (analytic_profile(LLAMA, H100, tp, (1,), compute=Compute(precision=p)).layers[1]
                 for p in ("bf16", "fp8"))
    # W is the linear layers' weight-gradient multiplies alone: at the FP8 rate
    assert bf16.t_w[0] / fp8.t_w[0] == pytest.approx(H100.fp8.rate / H100.rate)
    assert fp8.t_f[0] < bf16.t_f[0]  # attention's products and the element-wise passes stay
    linear = 2 * LLAMA.seq * (2 * LLAMA.hidden + LLAMA.v_dim) / 2 + 2 * LLAMA.seq * LLAMA.ffn / 2  # t = 2, SP
    assert bf16.activation_bytes[0] - fp8.activation_bytes[0] == pytest.approx(
        linear * (1 - H100.fp8.activation_factor))
    with pytest.raises(PlanError, match="--precision fp8: --hardware a100 has no fp8 entry"):
        analytic_profile(LLAMA, A100, tp, (1,), compute=Compute(precision="fp8"))


def test_plan_precision_fp8_changes_step_time_and_memory_by_the_factors(tmp_path, capsys):
    """The acceptance: the same layout planned in bf16 and fp8; the weights' state grows by the FP8 copies
    (fp8.weight_bytes a parameter), the kept activations shrink, the step gets faster."""
    got = {}
    for extra in ((), ("--precision", "fp8"), ("--precision", "fp8", "--fp8-all-gather")):
        rc, out, err = run(capsys, *FIXED, *extra, "--json", "-o", str(tmp_path / "p.csv"))
        assert rc == 0, err
        got[extra[-1] if extra else "bf16"] = json.loads(out)
    b, f, g = (got[k]["best"] for k in ("bf16", "fp8", "--fp8-all-gather"))
    assert (b["t"], b["p"], b["family"]) == (f["t"], f["p"], f["family"]) == (2, 2, "1f1b")
    assert f["step_time"] < b["step_time"]
    layers = analytic_profile(LLAMA, H100, TensorParallel(t=2), (1,)).layers

    def weights(c):  # bf16 bytes of the fullest GPU's weights (1F1B: rank r holds piece r)
        r = c["peak_memory"].index(max(c["peak_memory"]))
        lo = sum(c["counts"][:r])
        return sum(x.param_bytes for x in layers[lo:lo + c["counts"][r]])

    zero1 = 3 + 6 / 4  # bytes a bf16 weight byte: weights, fp32 gradients, ZeRO-1's state over dp 4
    assert b["memory_parts"]["state"] == pytest.approx(weights(b) * zero1)
    assert f["memory_parts"]["state"] == pytest.approx(weights(f) * (zero1 + H100.fp8.weight_bytes / 2))
    assert g["memory_parts"]["state"] == pytest.approx(weights(g) * (zero1 - 0.5))  # FP8 weights, no copies
    assert f["memory_parts"]["activations"] < b["memory_parts"]["activations"]
    meg = got["fp8"]["frameworks"]["megatron"]["command"]
    assert "--fp8-format hybrid" in meg and "--fp8-param-gather" in got["--fp8-all-gather"]["frameworks"]["megatron"][
        "command"]
    assert "--precision fp8" in " ".join(got["fp8"]["command"])
    assert "--precision fp8" in fails(capsys, *FIXED, "--hardware", "a100", "--precision", "fp8")
    assert "give --precision fp8 too" in fails(capsys, *FIXED, "--fp8-all-gather")


def test_async_tp_hides_the_collectives_behind_the_multiplies(tmp_path, capsys):
    plain, over = (analytic_profile(LLAMA, H100, TensorParallel(t=8, overlap=o), (1,)).layers[1] for o in (False, True))
    comm = 2 * tp_allreduce_time(2 * LLAMA.seq * LLAMA.hidden, 8, H100.intra)
    assert plain.t_f[0] - over.t_f[0] == pytest.approx(comm - comm / 8)  # the multiplies cover all but a chunk
    rc, out, err = run(capsys, *FIXED[:-2], "--async-tp", "--json", "-o", str(tmp_path / "a.csv"))
    plan = json.loads(out)
    assert rc == 0, err and set(plan["frameworks"]) == {"megatron", "torchtitan"}  # who overlaps TP
    assert "--tp-comm-overlap" in plan["frameworks"]["megatron"]["command"]
    assert "--parallelism.enable-async-tensor-parallel" in plan["frameworks"]["torchtitan"]["command"]
    assert "--async-tp: none of the frameworks" in fails(capsys, *FIXED[:-2], "--async-tp", "--framework", "deepspeed")


def test_selective_recomputation_by_module_kind():
    gpt = TransformerSpec.load("gpt-145b")  # no flash attention: core_attn drops the scores
    tp = TensorParallel(t=8)
    sbh = gpt.seq * gpt.hidden
    off = block_activation_bytes(gpt, 1, tp)
    assert off - block_activation_bytes(gpt, 1, tp, "selective", modules=("layernorm",)) == 2 * 2 * sbh / 8
    assert off - block_activation_bytes(gpt, 1, tp, "selective", modules=("mlp",)) == 4 * gpt.seq * gpt.ffn / 8
    sel = Compute(modules=("layernorm",))
    base, norm = (analytic_profile(gpt, H100, tp, (1,), recompute=rc, compute=sel).layers[1] for rc in ("off", "selective"))
    # two norms redone: each reads its input and writes its output again (2 bytes an element each way)
    assert norm.t_i[0] - base.t_i[0] == pytest.approx(2 * 2 * 2 * sbh / 8 / H100.memory_bandwidth)
    with pytest.raises(PlanError, match="--recompute-modules moe: each must be one of core_attn, layernorm"):
        Compute(modules=("moe",))


def test_selective_is_searched_for_a_flash_model_only_when_its_modules_drop_something():
    job = Job(spec=LLAMA, hardware=H100, gpus=8, global_batch_tokens=2**20, tensor=(8,), pipeline=(1,),
              space=Space(families=("1f1b",)), frameworks=(Job.__dataclass_fields__["frameworks"].default[0],))
    from stagewise.plan.cluster import recompute_modes

    assert "selective" not in recompute_modes(job)  # flash attention: core_attn keeps nothing less
    assert "selective" in recompute_modes(replace(job, recompute_modules=("layernorm",)))


def test_any_v_that_fits_the_layers_is_searched():
    job = Job(spec=LLAMA, hardware=H100, gpus=8, global_batch_tokens=2**20, tensor=(1,), pipeline=(4,),
              micro_batch_sizes=(1,), space=Space(families=("interleaved-1f1b",), chunks=None))
    from stagewise.plan.cluster import searchers

    vs = {c.v for s in searchers(job, {}) for c in s.configs(build=False)}
    assert {2, 3, 5, 8} <= vs and max(vs) == 34 // 4  # E + 32 blocks + H over 4 ranks
    assert {c.config.v for c in cluster_search(job, keep=50).ranking} - {2, 4, 8}  # not only {2, 4, 8}


def test_the_step_overhead_is_the_hardware_files_fixed_and_per_action_seconds(tmp_path):
    job = Job(spec=LLAMA, hardware=H100, gpus=8, global_batch_tokens=2**20, tensor=(8,), pipeline=(1,),
              micro_batch_sizes=(1,), space=Space(families=("1f1b",)))
    with_, without = (cluster_search(replace(job, hardware=hw), keep=1).ranking[0]
                      for hw in (H100, replace(H100, step_fixed=0.0, step_per_action=0.0)))
    actions = max(len(p) for p in with_.candidate.schedule.programs)  # of the 2 mc stand-in of a long step
    if with_.costed_from:
        actions *= with_.config.m / (2 * with_.costed_from)
    assert actions == 2 * with_.config.m  # p = 1: a forward and a backward per micro-batch
    assert with_.candidate.overhead == pytest.approx(H100.step_fixed + H100.step_per_action * actions)
    assert with_.step_time - without.step_time == pytest.approx(with_.candidate.overhead)
    data = json.loads((Path(__file__).parents[1] / "stagewise/plan/cluster/data/hardware/h100.json").read_text())
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({**data, "step_overhead": {"fixed": -1}}))
    with pytest.raises(SpecError, match="step_overhead: fixed must be >= 0"):
        Hardware.load(str(path))


def test_every_memory_cell_has_a_band(tmp_path, capsys):
    """The memory column is the allocator's predicted peak (the planned tensors + the reserve's fragmentation)
    with the hardware file's memory band, in the table and the JSON."""
    rc, out, err = run(capsys, *FIXED[:-2], "--top", "5", "-o", str(tmp_path / "m.csv"))
    assert rc == 0, err
    import re

    assert any("mem/GPU (band)" in ln for ln in out.splitlines())
    rows = [ln for ln in out.splitlines() if re.match(r"\s+\d+[= ] ", ln)]
    cells = [re.search(r"(\d+(?:\.\d+)?) GiB \((\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)\)", ln) for ln in rows]
    assert all(cells) and len(cells) >= 3  # the frameworks' rows of the one layout
    for c in cells:
        mid, lo, hi = (float(x) for x in c.groups())
        assert lo < mid < hi and hi / mid == pytest.approx(1 + H100.memory_band, abs=0.01)
    rc, out, _ = run(capsys, *FIXED, "--json", "-o", str(tmp_path / "m.csv"))
    best = json.loads(out)["best"]
    frag = H100.reserve.fragmentation * H100.memory
    assert best["peak_memory_reserved"] == pytest.approx(max(best["peak_memory"]) + frag)
    lo, hi = best["peak_memory_reserved_band"]
    assert (lo, hi) == pytest.approx((best["peak_memory_reserved"] * (1 - H100.memory_band),
                                      best["peak_memory_reserved"] * (1 + H100.memory_band)))
    parts = best["memory_parts"]
    assert sum(parts.values()) == pytest.approx(max(best["peak_memory"]))
