"""What the frameworks themselves would build from a printed line: Megatron-LM's argument names (a fixture
from a pinned commit) and its layer-count rules, and the planner requests the framework tests share.

``megatron_builds`` follows Megatron-LM's ``get_num_layers_to_build`` (megatron/core/transformer/
transformer_block.py) and ``PipelineParallelLayerLayout`` (pipeline_parallel_layer_layout.py) at the
fixture's commit, and ``megatron_validate`` the pipeline rules of its ``validate_args`` (megatron/training/
arguments.py): written from reading them, checked once against that source itself on 62 cases (planner rows and
synthetic splits), with the fetched Megatron-LM imported.
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
