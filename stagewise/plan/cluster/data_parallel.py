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
forward was due delays the step. Block by block (``Framework.per_block``) FSDP gathers a
stage again for every op, a layer ahead of it (a backward from its last layer), and
reduce-scatters each layer's gradients as the backward leaves it.

Sharding (``parallelism.SHARDINGS``), bytes per bf16 parameter byte held on a GPU:

- ddp: weights 1 + fp32 gradients 2 + fp32 master weights and Adam's moments 6; the
  gradients are all-reduced;
- zero1 (Rajbhandari et al. 2020): the 6 of optimizer state divided by dp; gradients
  reduce-scattered, updated bf16 weights all-gathered;
- fsdp (FSDP2 per stage, as the runtime runs it): a stage's bf16 weights are gathered
  for the step and its fp32 gradients accumulate unsharded until its last backward (1 +
  2, for every stage a rank holds), and the sharded fp32 weights, moments and reduced
  gradient (2 + 4 + 2) are divided by the shard group; where FSDP runs block by block
  (``Framework.per_block``) the 1 + 2 shrink to a window of layers (``held_gathered``);
- hsdp: fsdp over a shard group of ``shard`` replicas, whose reduced shards are then
  all-reduced across the dp / shard groups.
"""

from __future__ import annotations

from typing import Callable

from ...actions import Pair
from ...lowering.rank_memory import at_once
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


def held_gathered(layer_bytes: list[float], *, per_block: bool) -> float:
    """Bytes a sharded (FSDP, HSDP) stage whose layers hold these bf16 weight bytes holds only while gathered,
    at its peak: ``gathered_factor``'s 1 + 2 of the whole stage; block by block (``Framework.per_block``) its
    two largest neighbouring layers' weights and gradients (``lowering.rank_memory.at_once``: the one computing,
    the one prefetched or being reduced), since every backward reduce-scatters the gradients it makes as it
    leaves each layer (the lowering's "each" rule), whatever the micro-batches.

    >>> held_gathered([1.0, 2.0, 5.0], per_block=False), held_gathered([1.0, 2.0, 5.0], per_block=True)
    (24.0, 21.0)
    """
    whole = sum(layer_bytes)
    if not per_block or whole <= 0:
        return whole * (1.0 + GRAD_BYTES_PER_PARAM_BYTE)
    return at_once([b / whole for b in layer_bytes]) * whole * (1.0 + GRAD_BYTES_PER_PARAM_BYTE)


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
    if rule == "each":  # every backward op reduces its layers as it leaves them
        out = []
        for k, op in enumerate(prog):
            back = op.backward if type(op) is Pair else op
            if back.kind in ("B", "W"):
                out += _as_left(starts[k], ends[k], piece_layer_bytes[stage_piece[back.stage]])
        return out
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
            out += _as_left(a, e, layers)
        else:  # the whole stage at once: after its last backward, or once the rank has drained
            out.append((e if rule == "stage" else drained, sum(layers)))
    return out


def _as_left(a: float, e: float, layers: list[float]) -> list[tuple[float, float]]:
    """(when, bytes) of each layer's gradients as a backward running from ``a`` to ``e`` leaves it, the last
    layer first."""
    n = len(layers)
    return [(a + (e - a) * (k + 1) / n, nbytes) for k, nbytes in enumerate(reversed(layers))]


def exposed_gather(tl: Timeline, piece_layer_bytes: list[list[float]], stage_piece, unit: str,
                   cost: Callable[[float], float], per_block: bool = False) -> float:
    """Seconds the step waits for weights all-gathered ahead of their first forward (``unit``: "layer" or
    "stage", ``overlap.GATHER``), one unit ahead of the compute: a unit's gather starts when the previous one
    has ended and the compute has reached the unit before it; the largest lateness delays the step.
    ``cost`` gives the seconds to all-gather a unit's bf16 parameter bytes. ``per_block``
    (``Framework.per_block``): every op gathers its stage again layer by layer, a backward from its last."""
    t0 = min(st[0] for st in tl.starts if st)
    worst = 0.0
    for r, prog in enumerate(tl.schedule.programs):
        done, need_before, shift = 0.0, 0.0, 0.0
        for op, (a, e) in _gathering_ops(prog, tl.starts[r], tl.ends[r], len(tl.schedule.stages_of_rank(r)),
                                        per_block):
            layers = piece_layer_bytes[stage_piece[op.stage]]
            a, e = a - t0 + shift, e - t0 + shift
            if unit == "layer" or per_block:  # the op reaches its k-th layer a k/n of the way through
                order = layers if op.kind == "F" else layers[::-1]
                units = [(a + (e - a) * k / len(order), b) for k, b in enumerate(order)]
            else:
                units = [(a, sum(layers))]
            late = 0.0
            for need, nbytes in units:
                done = max(done, need_before) + cost(nbytes)
                late = max(late, done - need)
                need_before = need
            if per_block:  # every op gathers: an op that waited starts the ones after it that much later
                shift += late
            worst = max(worst, shift if per_block else late)
    return worst


def _gathering_ops(prog, starts, ends, n_stages: int, per_block: bool) -> list:
    """(action, (start, end)) of the ops of one rank that gather: each stage's first forward (``n_stages``:
    how many the rank holds), in time order; ``per_block``: every op (a pair's forward half)."""
    first: dict[int, tuple] = {}
    for op, s0, s1 in zip(prog, starts, ends):
        a = op.forward if type(op) is Pair else op
        if per_block:
            first[len(first)] = (a, (s0, s1))
        elif a.kind == "F" and a.stage not in first:
            first[a.stage] = (a, (s0, s1))
            if len(first) == n_stages:  # the first forwards come first: the rest cannot add one
                break
    return sorted(first.values(), key=lambda x: x[1])
