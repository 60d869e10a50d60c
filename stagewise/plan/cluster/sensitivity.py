"""What moves a cluster plan's step most: the winner's layout re-costed with one input changed at a time
(matrix-multiply efficiency, the node's link, the network, another recomputation)."""

from __future__ import annotations

from dataclasses import replace

from ..errors import PlanError
from ..search import Link
from .overlap_rules import framework
from .search import cluster_search

#: how much each sensitivity probe changes its input
EFFICIENCY_STEP = 0.9  #: efficiency x 0.9 (10% slower matrix multiplies)
BANDWIDTH_STEP = 0.5  #: a link at half its bandwidth


def sensitivity(job, best, schedules: dict | None = None) -> list[dict]:
    """The winner's step with one input changed at a time: [{"input", "change", "step", "delta", "fits"}], the
    largest move first. Each probe re-plans the winner's layout (t, p, family, v, micro-batch size,
    sharding, framework) with the changed input, so the split may move with it."""
    hw = job.hardware
    probes = [("efficiency", f"x{EFFICIENCY_STEP:g}", replace(hw, efficiency=hw.efficiency * EFFICIENCY_STEP), None),
              ("node link bandwidth", f"x{BANDWIDTH_STEP:g}",
               replace(hw, intra=Link(latency=hw.intra.latency, bandwidth=hw.intra.bandwidth * BANDWIDTH_STEP)), None),
              ("network bandwidth", f"x{BANDWIDTH_STEP:g}",
               replace(hw, inter=Link(latency=hw.inter.latency, bandwidth=hw.inter.bandwidth * BANDWIDTH_STEP)), None)]
    fw = framework(best.framework)
    mine = "full" if best.recompute == "stage" else best.recompute
    for mode in ("off", "selective", "full"):
        same = mode == "selective" and job.spec.flash_attention  # flash attention keeps no scores either way
        if mode != mine and not same and (mode == "off" or mode in fw.recompute) and mode in job.recompute:
            probes.append(("recomputation", f"{_rc_name(best.recompute)} -> {_rc_name(mode, fw)}", hw, mode))
    out = []
    for name, change, hw2, mode in probes:
        got = _replan(job, best, fw, hw2, mode or mine, schedules)
        if got is None:
            if mode is not None:
                out.append({"input": name, "change": change, "step": None, "delta": None, "fits": False})
            continue
        out.append({"input": name, "change": change, "step": got.step_time,
                    "delta": got.step_time / best.step_time - 1, "fits": True})
    return sorted(out, key=lambda x: -abs(x["delta"]) if x["delta"] is not None else 1.0)


def _rc_name(mode: str, fw=None) -> str:
    if fw is not None and mode == "full" and fw.stage_recompute:
        return "stage"
    return mode


def _replan(job, best, fw, hw, mode: str, schedules):
    """The winner's layout planned again under ``hw`` and recomputation ``mode``; None if it does not fit."""
    g = best.config
    space = replace(job.space, families=(g.family,), chunks=(g.v,))
    par = best.parallelism
    expert = dict(expert=(par.expert_degree,), expert_tensor=(par.expert_tp,),
                  expert_placement=(best.expert_placement,)) if job.spec.moe is not None else {}
    probe = replace(job, hardware=hw, tensor=(par.tp,), pipeline=(g.p,), micro_batch_sizes=(g.mbs,),
                    recompute=(mode,), frameworks=(fw,), sharding=(best.sharding,),
                    hsdp_shards=(par.fsdp,) if best.sharding == "hsdp" else job.hsdp_shards, space=space,
                    slices=(best.slices,), offload=(best.offload,), **expert)
    try:
        res = cluster_search(probe, keep=1, schedules=schedules)
    except PlanError:
        return None
    return res.ranking[0] if res.ranking else None
