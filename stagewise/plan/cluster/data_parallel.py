"""Data-parallel traffic around the pipeline: the gradient reduction, the weight all-gathers, their memory.

A layer's gradient is final when the last backward of its stage (B, or W when split)
has passed it. When its reduction may start is the framework's rule
(``overlap.REDUCE``): as the backward passes each layer (bucketed overlap), after the
stage's last backward, or after the rank's last op (the pipeline drained). Reductions
run one at a time on the rank's link, overlapping whatever work the rank still has;
only what runs past the pipeline's last op is exposed.

Sharded weights are all-gathered once per step (``overlap.GATHER``): after the optimizer
step (exposed, ZeRO-1 in DeepSpeed and stagewise), or ahead of each layer's or stage's
first forward of the step, one unit ahead of the compute (Megatron-LM's
``--overlap-param-gather``, FSDP); only a gather that finishes after its unit's first
forward was due delays the step.

Sharding (``overlap.SHARDING``), bytes per bf16 parameter byte held on a GPU:

- ddp: weights 1 + fp32 gradients 2 + fp32 master weights and Adam's moments 6; the
  gradients are all-reduced;
- zero1 (Rajbhandari et al. 2020): the 6 of optimizer state divided by dp; gradients
  reduce-scattered, updated bf16 weights all-gathered;
- fsdp (FSDP2 per stage, as the runtime runs it): a stage's bf16 weights are gathered
  for the step and its fp32 gradients accumulate unsharded until its last backward (1 +
  2, for every stage a rank holds), and the sharded fp32 weights, moments and reduced
  gradient (2 + 4 + 2) are divided by the shard group;
- hsdp: fsdp over a shard group of ``shard`` replicas, whose reduced shards are then
  all-reduced across the dp / shard groups.
"""

from __future__ import annotations

from typing import Callable

from ...actions import Pair
from ...timeline import Timeline
from ..search import Link

GRAD_BYTES_PER_PARAM_BYTE = 2  #: fp32 gradients of bf16 weights
#: what a checkpoint holds per parameter: bf16 weights 2, fp32 master weights 4, Adam's two moments 8 (the
#: state above less the gradients, which are not saved)
CHECKPOINT_BYTES_PER_PARAM = 14


def reduce_scatter_time(nbytes: float, dp: int, link: Link) -> float:
    """Ring reduce-scatter (or all-gather) of ``nbytes`` among ``dp`` GPUs."""
    if dp == 1:
        return 0.0
    return (dp - 1) * link.latency + (dp - 1) / dp * nbytes / link.bandwidth


def state_factor(dp: int, zero: bool = True, sharding: str | None = None, shard: int | None = None) -> float:
    """Bytes per bf16 parameter byte held on a GPU at the step's peak (see the module doc).

    >>> state_factor(8, False), state_factor(8, True), state_factor(8, sharding="fsdp")
    (9.0, 3.75, 4.0)
    """
    mode = sharding or ("zero1" if zero else "ddp")
    if mode == "ddp":
        return 9.0
    if mode == "zero1":
        return 3 + 6 / dp
    return 3 + 8 / (shard or dp)  # fsdp, hsdp


def gathered_factor(sharding: str) -> float:
    """Of ``state_factor``, the bytes per bf16 parameter byte a sharded stage holds only while it is gathered
    (FSDP and HSDP: its bf16 weights and unsharded fp32 gradients, 1 + 2; the runtime's rule, a stage
    gathered from its first forward to its last backward), which the lowered program's UNSHARD and RESHARD
    points bound; none for replicated or ZeRO-1 weights.

    >>> gathered_factor("fsdp"), gathered_factor("zero1")
    (3.0, 0.0)
    """
    return 1.0 + GRAD_BYTES_PER_PARAM_BYTE if sharding in ("fsdp", "hsdp") else 0.0


def reduction_cost(mode: str, dp: int, shard: int | None, link: Link, across: Link) -> Callable[[float], float]:
    """Seconds to reduce ``nbytes`` of fp32 gradients under ``mode`` among ``dp`` replicas (``across``: the
    link between HSDP's shard groups)."""
    if dp == 1:
        return lambda nbytes: 0.0
    if mode == "ddp":  # a ring all-reduce is a reduce-scatter then an all-gather
        return lambda nbytes: 2 * reduce_scatter_time(nbytes, dp, link)
    if mode == "hsdp":
        s, r = shard, dp // shard
        return lambda nbytes: reduce_scatter_time(nbytes, s, link) + 2 * reduce_scatter_time(nbytes / s, r, across)
    return lambda nbytes: reduce_scatter_time(nbytes, dp, link)  # zero1, fsdp


def exposed_reduction(tl: Timeline, piece_layer_bytes: list[list[float]], stage_piece, dp: int,
                      link: Link, *, all_reduce: bool = False, rule: str = "layer",
                      cost: Callable[[float], float] | None = None) -> float:
    """Seconds the gradient reduction runs past the end of the pipeline's last op.

    ``piece_layer_bytes[k]`` lists the parameter bytes of piece k's layers in model order; ``rule`` is when a
    reduction may start (``overlap.REDUCE``); ``cost`` the seconds to reduce a layer's fp32 gradients (by
    default a ring reduce-scatter among ``dp``, an all-reduce with ``all_reduce``).
    """
    if dp == 1:
        return 0.0
    if cost is None:
        passes = 2 if all_reduce else 1
        cost = lambda nbytes: passes * reduce_scatter_time(nbytes, dp, link)  # noqa: E731
    end = max(en[-1] for en in tl.ends if en)
    latest = end
    for r, prog in enumerate(tl.schedule.programs):
        if not prog:
            continue
        busy = 0.0
        units = _ready(prog, tl.starts[r], tl.ends[r], piece_layer_bytes, stage_piece, rule,
                       len(tl.schedule.stages_of_rank(r)))
        for ready, nbytes in sorted(units):
            busy = max(busy, ready) + cost(GRAD_BYTES_PER_PARAM_BYTE * nbytes)
        latest = max(latest, busy)
    return latest - end


def _ready(prog, starts, ends, piece_layer_bytes, stage_piece, rule: str,
           n_stages: int) -> list[tuple[float, float]]:
    """(time a reduction may start, parameter bytes) of each unit of one rank's gradients (``n_stages``: how
    many stages the rank holds; the caller sorts the units)."""
    last: dict[int, tuple[float, float]] = {}  # stage -> (start, end) of its last backward op
    for k in range(len(prog) - 1, -1, -1):  # from the end: the last backwards come last, so this stops early
        op = prog[k]
        back = op.backward if type(op) is Pair else op
        if back.kind in ("B", "W") and back.stage not in last:
            last[back.stage] = (starts[k], ends[k])
            if len(last) == n_stages:
                break
    drained = ends[-1]
    out = []
    for stage, (a, e) in last.items():
        layers = piece_layer_bytes[stage_piece[stage]]
        if rule == "layer":
            n = len(layers)
            out += [(a + (e - a) * (k + 1) / n, nbytes) for k, nbytes in enumerate(reversed(layers))]
        else:  # the whole stage at once: after its last backward, or once the rank has drained
            out.append((e if rule == "stage" else drained, sum(layers)))
    return out


def exposed_gather(tl: Timeline, piece_layer_bytes: list[list[float]], stage_piece, unit: str,
                   cost: Callable[[float], float]) -> float:
    """Seconds the step waits for weights all-gathered ahead of their first forward (``unit``: "layer" or
    "stage", ``overlap.GATHER``), one unit ahead of the compute: a unit's gather starts when the previous one
    has ended and the compute has reached the unit before it; the largest lateness delays the step.
    ``cost`` gives the seconds to all-gather a unit's bf16 parameter bytes."""
    t0 = min(st[0] for st in tl.starts if st)
    worst = 0.0
    for r, prog in enumerate(tl.schedule.programs):
        first: dict[int, tuple[float, float]] = {}  # stage -> (start, end) of its first forward on this rank
        n_stages = len(tl.schedule.stages_of_rank(r))
        for op, s0, s1 in zip(prog, tl.starts[r], tl.ends[r]):
            fwd = op.forward if type(op) is Pair else op
            if fwd.kind == "F" and fwd.stage not in first:
                first[fwd.stage] = (s0 - t0, s1 - t0)
                if len(first) == n_stages:  # the first forwards come first: the rest cannot add one
                    break
        units = []
        for stage in sorted(first, key=first.get):
            layers = piece_layer_bytes[stage_piece[stage]]
            a, e = first[stage]
            if unit == "layer":  # the forward reaches layer k a k/n of the way through
                units += [(a + (e - a) * k / len(layers), b) for k, b in enumerate(layers)]
            else:
                units.append((a, sum(layers)))
        done, need_before = 0.0, 0.0
        for need, nbytes in units:
            done = max(done, need_before) + cost(nbytes)
            worst = max(worst, done - need)
            need_before = need
    return worst
