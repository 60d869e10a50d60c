"""Data-parallel gradient traffic at the end of a step, overlapped with the backward that remains.

ZeRO-1 (Rajbhandari et al. 2020): each replica reduce-scatters its fp32
gradients over the ``dp`` replicas of its pipeline rank, steps the optimizer on
its shard and all-gathers the bf16 weights. A layer's gradient is final when the
last backward of its stage (B, or W when split) has passed it, so the reduce-scatter
of each layer starts then, in backward order, one at a time on the rank's link,
and overlaps whatever backward work the rank still has; only what runs past the
last op of the pipeline is exposed. The weight all-gather follows the optimizer
step and is exposed. Without ZeRO the gradients are all-reduced (twice the
reduce-scatter's time) and the optimizer step is not sharded.
"""

from __future__ import annotations

from ..actions import Pair
from ..timeline import Timeline
from .profile import Link

GRAD_BYTES_PER_PARAM_BYTE = 2  #: fp32 gradients of bf16 weights


def reduce_scatter_time(nbytes: float, dp: int, link: Link) -> float:
    """Ring reduce-scatter (or all-gather) of ``nbytes`` among ``dp`` GPUs."""
    if dp == 1:
        return 0.0
    return (dp - 1) * link.latency + (dp - 1) / dp * nbytes / link.bandwidth


def exposed_reduction(tl: Timeline, piece_layer_bytes: list[list[float]], stage_piece, dp: int,
                      link: Link, *, all_reduce: bool = False) -> float:
    """Seconds the gradient reduce-scatter (``all_reduce``: all-reduce, without ZeRO) runs past the
    end of the pipeline's last op.

    ``piece_layer_bytes[k]`` lists the parameter bytes of piece k's layers in model order.
    """
    passes = 2 if all_reduce else 1  # a ring all-reduce is a reduce-scatter then an all-gather
    if dp == 1:
        return 0.0
    end = max(en[-1] for en in tl.ends if en)
    latest = end
    for r, prog in enumerate(tl.schedule.programs):
        last: dict[int, tuple[float, float]] = {}  # stage -> (start, end) of its last backward op
        for op, s0, s1 in zip(prog, tl.starts[r], tl.ends[r]):
            back = op.backward if type(op) is Pair else op
            if back.kind in ("B", "W"):
                last[back.stage] = (s0, s1)
        buckets = []
        for stage, (a, e) in last.items():
            layers = piece_layer_bytes[stage_piece[stage]]
            n = len(layers)
            for k, nbytes in enumerate(reversed(layers)):  # the backward meets the last layer first
                buckets.append((a + (e - a) * (k + 1) / n, nbytes))
        busy = 0.0
        for ready, nbytes in sorted(buckets):
            busy = max(busy, ready) + passes * reduce_scatter_time(GRAD_BYTES_PER_PARAM_BYTE * nbytes, dp, link)
        latest = max(latest, busy)
    return latest - end
