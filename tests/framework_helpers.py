"""What the frameworks themselves would build from a printed line: Megatron-LM's argument names (a fixture
from a pinned commit) and its layer-count rules, and the planner requests the framework tests share.

``megatron_builds`` follows Megatron-LM's ``get_num_layers_to_build`` (megatron/core/transformer/
transformer_block.py) and ``PipelineParallelLayerLayout`` (pipeline_parallel_layer_layout.py) at the
fixture's commit, and ``megatron_validate`` the pipeline rules of its ``validate_args`` (megatron/training/
arguments.py): written from reading them, checked once against that source itself on 62 cases (planner rows and
synthetic splits), with the fetched Megatron-LM imported. ``megatron_model_validate`` holds its model rules
(``required_args`` and what it defaults otherwise): checked once by running Megatron-LM's own ``parse_args``,
``validate_args`` and ``core_transformer_config_from_args`` (its GPU-only imports stubbed, an H100's
capability, CUDA_DEVICE_MAX_CONNECTIONS=1) on 72 printed lines: two rows of each of the 32 shipped models and
of four user-written ones (MoE every 2nd block with a dense list and a capacity, sliding windows and tied
embeddings with dropout, MLA without a query rank with MTP, a head_dim of its own); all passed.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).parent / "data"


@lru_cache(maxsize=1)
def megatron_names() -> frozenset[str]:
    """Every option Megatron-LM's parser knows at the fixture's commit."""
    return frozenset(json.loads((DATA / "megatron_args.json").read_text())["options"])


def megatron_args(line: str) -> dict:
    """The printed flags as {name: value or True}; every name must be one Megatron-LM knows."""
    words, out, k = shlex.split(line), {}, 0
    while k < len(words):
        name = words[k]
        assert name in megatron_names(), f"{name} is not a Megatron-LM option"
        if k + 1 < len(words) and not words[k + 1].startswith("--"):
            out[name[2:]], k = words[k + 1], k + 2
        else:
            out[name[2:]], k = True, k + 1
    return out


def megatron_validate(a: dict) -> None:
    """The pipeline rules of Megatron-LM's validate_args that a printed line meets."""
    p = int(a["pipeline-model-parallel-size"])
    vpp_ways = [k for k in ("num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
                            "pipeline-model-parallel-layout") if k in a]
    assert len(vpp_ways) <= 1, vpp_ways
    uneven = "decoder-first-pipeline-num-layers" in a or "decoder-last-pipeline-num-layers" in a
    assert not (uneven and ("account-for-embedding-in-pipeline-split" in a or "pipeline-model-parallel-layout" in a))
    if "pipeline-model-parallel-layout" in a:
        assert len(_stages(a["pipeline-model-parallel-layout"])) % p == 0
    if _vpp(a) > 1 and "no-overlap-p2p-communication" not in a:
        assert p > 1, "an interleaved schedule needs --pipeline-model-parallel-size > 1"
    if "overlap-param-gather" in a:
        assert "use-distributed-optimizer" in a and "overlap-grad-reduce" in a


#: the arguments Megatron-LM's validate_args requires of every GPT model (its ``required_args``)
MEGATRON_REQUIRED = ("num-layers", "hidden-size", "num-attention-heads", "max-position-embeddings")


def megatron_model_validate(a: dict, spec) -> None:
    """The model rules of Megatron-LM's validate_args (and of the TransformerConfig it builds) that a printed line
    meets, and the model it builds from the line is the model file's ``spec``: its defaults where a flag is
    absent (gelu, 4h MLP, one query group per head, hidden / heads channels, tied embeddings, dropout 0.1, no
    experts, no windows, the vocabulary of a tokenizer the line does not name)."""
    for name in MEGATRON_REQUIRED:
        assert name in a, f"--{name} is required by Megatron-LM's validate_args"
    L, h, heads = int(a["num-layers"]), int(a["hidden-size"]), int(a["num-attention-heads"])
    assert int(a["max-position-embeddings"]) >= int(a["seq-length"]) == spec.seq
    assert "kv-channels" in a or h % heads == 0, "validate_args: hidden % heads without --kv-channels"
    assert (L, h, heads) == (spec.layers, spec.hidden, spec.heads)
    assert int(a.get("ffn-hidden-size", 0)) == spec.ffn, "Megatron-LM's default MLP width is not the model's"
    assert ("swiglu" in a) == (spec.mlp == "swiglu") and ("untie-embeddings-and-output-weights" in a) != \
        spec.tied_embeddings
    assert a.get("tokenizer-type") == "NullTokenizer" and int(a["vocab-size"]) == spec.vocab and "mock-data" in a
    assert (a.get("attention-dropout") == a.get("hidden-dropout") == "0") != spec.dropout
    if spec.mla:
        m = spec.mla
        assert "multi-latent-attention" in a and a.get("position-embedding-type") == "rope"
        assert (int(a["kv-lora-rank"]), int(a["qk-head-dim"]), int(a["qk-pos-emb-head-dim"]), int(a["v-head-dim"])) \
            == (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)
        assert int(a.get("q-lora-rank", 0)) == (m.q_lora_rank or 0)
    else:
        groups = int(a["num-query-groups"]) if "group-query-attention" in a else heads
        assert groups == spec.kv_heads and int(a.get("kv-channels", h // heads)) == spec.head_size
    moe = [spec.moe is not None and spec.moe.is_moe(i) for i in range(L)]
    if spec.moe:
        e = spec.moe
        assert (int(a["num-experts"]), int(a["moe-router-topk"]), int(a["moe-ffn-hidden-size"])) == \
            (e.experts, e.top_k, e.expert_ffn)
        assert int(a.get("moe-shared-expert-intermediate-size", 0)) == e.shared_experts * e.expert_ffn
        freq = megatron_pattern_value(a.get("moe-layer-freq", "1"), L)
        assert [bool(x) for x in freq] == moe
        assert ("moe-expert-capacity-factor" in a) == (e.capacity_factor is not None)
    else:
        assert "num-experts" not in a
    if spec.sliding_window is not None and spec.layer_types:
        assert a["window-size"] == f"{spec.sliding_window - 1},0"
        assert megatron_pattern_value(a["window-attn-skip-freq"], L) == [int(spec.sliding(i)) for i in range(L)]
    else:
        assert "window-size" not in a
    assert int(a.get("mtp-num-layers", 0)) == spec.mtp_layers
    if spec.mtp_layers:
        assert a.get("position-embedding-type") in ("rope", "none"), "validate_args: MTP needs rope or none"
    if "pipeline-model-parallel-layout" in a:  # TransformerConfig: the layout's MTP modules are mtp_num_layers
        assert _stages(a["pipeline-model-parallel-layout"])[-1].count("m") == spec.mtp_layers


def megatron_pattern_value(text: str, layers: int) -> list[int]:
    """Megatron-LM's ``moe_freq_type``: N (every N-th layer, from the first) or a list expression of the
    characters it admits, whose length must be the layers'."""
    if "[" not in text:
        n = int(text)
        return [int(i % n == 0) for i in range(layers)]
    assert not re.search(r"[^,\d\[\]()+*]", text), text
    out = eval(text)  # noqa: S307 - checked to digits, brackets, commas, + and *, as Megatron-LM evaluates it
    assert len(out) == layers, f"the pattern has {len(out)} layers, the model {layers}"
    return out


def _stages(layout: str) -> list[str]:
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m[1] * int(m[2]), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m[1] * int(m[2]), text)
    assert set(text) <= set("ELtm|"), text
    return text.split("|")


def _vpp(a: dict) -> int:
    """The virtual stages per pipeline rank Megatron-LM derives (1 when not interleaved)."""
    p = int(a["pipeline-model-parallel-size"])
    if "pipeline-model-parallel-layout" in a:
        return len(_stages(a["pipeline-model-parallel-layout"])) // p
    return int(a.get("num-virtual-stages-per-pipeline-rank", 1))


def megatron_builds(a: dict) -> list[list[int]]:
    """Decoder layers Megatron-LM builds on each (pipeline rank, virtual stage)."""
    p, L, v = int(a["pipeline-model-parallel-size"]), int(a["num-layers"]), _vpp(a)
    if "pipeline-model-parallel-layout" in a:
        stages = _stages(a["pipeline-model-parallel-layout"])
        text = "".join(stages)
        assert text[0] == "E" and text[-1] == "L" and text.count("E") == text.count("L") == 1
        assert text.count("t") == L, f"the layout has {text.count('t')} blocks, the model {L}"
        return [[stages[vp * p + r].count("t") for vp in range(v)] for r in range(p)]
    first, last = a.get("decoder-first-pipeline-num-layers"), a.get("decoder-last-pipeline-num-layers")
    emb, loss = "account-for-embedding-in-pipeline-split" in a, "account-for-loss-in-pipeline-split" in a
    out = []
    for r in range(p):
        if first is not None or last is not None:
            rest, left = L, p
            if first is not None:
                rest, left = rest - int(first), left - 1
            if last is not None:
                rest, left = rest - int(last), left - 1
            assert left == 0 or rest % left == 0, "the left-over layers must divide the left-over stages"
            per_rank = rest // left if left else 0
            if r == 0 and first is not None:
                per_rank = int(first)
            if r == p - 1 and last is not None:
                per_rank = int(last)
        else:
            total = L + emb + loss
            assert total % p == 0, f"{total} layers do not divide into {p} pipeline ranks"
            per_rank = total // p
        vp = v if p > 1 else 1  # Megatron-LM ignores virtual stages without pipeline parallelism
        assert per_rank % vp == 0, f"{per_rank} layers of rank {r} do not divide into {vp} virtual stages"
        chunks = [per_rank // vp] * vp
        if emb and r == 0:
            chunks[0] -= 1
        if loss and r == p - 1:
            chunks[-1] -= 1
        assert min(chunks) >= 0
        out.append(chunks)
    return out


#: planner requests (model, hardware, GPUs, global batch tokens, extra options) the framework tests plan
REQUESTS = [
    ("llama3-8b", "h100", 64, "2M", {}),
    ("llama3-8b", "h100", 64, "2M", {"schedules": ("interleaved-1f1b",), "chunks": (4,)}),
    ("llama3-70b", "h100", 256, "2M", {"schedules": ("zb-v", "interleaved-1f1b", "1f1b"), "chunks": (2, 4)}),
    ("llama3-405b", "h100", 2048, "16M", {"tensor": (8,), "pipeline": (16, 32)}),
]


@lru_cache(maxsize=None)
def planned(n: int, keep: int = 12):
    """(job, result) of ``REQUESTS[n]`` through the planner's Python API."""
    from stagewise.plan.cluster import Job, cluster_search
    from stagewise.plan.cluster import Hardware
    from stagewise.plan.search import Space
    from stagewise.plan.cluster import TransformerSpec

    model, hw, gpus, tokens, extra = REQUESTS[n]
    from stagewise.cli.plan_cluster import parse_tokens

    space = Space(families=extra.get("schedules"), chunks=extra.get("chunks", (2, 4, 8)))
    job = Job(spec=TransformerSpec.load(model), hardware=Hardware.load(hw), gpus=gpus,
              global_batch_tokens=parse_tokens(tokens), space=space, tensor=extra.get("tensor"),
              pipeline=extra.get("pipeline"))
    return job, cluster_search(job, keep=keep)


def rows(framework: str):
    """(job, candidate) for every ranked row of ``framework`` over ``REQUESTS``."""
    for n in range(len(REQUESTS)):
        job, res = planned(n)
        for c in res.ranking:
            if c.framework == framework:
                yield job, c
