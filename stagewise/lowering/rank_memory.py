"""What a rank holds over its lowered program, by kind, and its peak: time-free, as ``timeline.peak_memory``
(a rank's actions run one after another, so a running sum in program order has every level the rank reaches).

The kinds, each read off the lowered program's own actions:

- ``activations``: a (stage, mb) activation from its F to its backward, as costs.py says (``costs.freed``: all
  at B, ``free_at_i`` of it at I, the rest at W). With nothing else held this is ``timeline.peak_memory``.
  Memory actions: an OFFLOAD frees the activation where it stands in the program and a RELOAD brings it back
  there (time-free: the host link is taken to keep up; ``Timeline.memory_curve`` has the timed levels), the F of
  a unit with a RECOMPUTE keeps ``kept`` of its activation and the RECOMPUTE brings back the rest.
- ``gathered``: a sharded stage's unsharded weights (``Sizes.params``) from its ``UNSHARD`` over fsdp to its
  ``RESHARD``: FSDP2 allocates the all-gather outputs when it unshards and frees them when it reshards
  (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, ``alloc_all_gather_outputs`` and
  ``free_unsharded_param``); ZeRO-1's gather over dp refreshes weights it holds anyway (state, not here).
  Gathered layer by layer (``reshard_after_forward``: FSDP2 frees each layer after it ran and prefetches the
  next), a stage holds ``at_once`` of its weights: its two largest neighbouring layers (``Sizes.layers``).
- ``grads``: a sharded stage's unsharded gradients (``Sizes.grads``) from its first action that makes weight
  gradients (B or W; I makes input gradients only) to its ``REDUCE_GRAD``: while pipelining keeps
  ``set_requires_gradient_sync(False)`` FSDP2 accumulates them unsharded (``unsharded_accumulated_grad``,
  _fsdp_param_group.py ``post_backward``), and the stage's REDUCE_GRAD runs the reduce-scatter that frees
  them (torch/distributed/pipelining/stage.py ``perform_reduce_grad``). Replicated gradients are state.
  Made and reduced bucket by bucket in one op (its reduction runs ``during`` it, and no earlier backward made
  any: FSDP2's per-layer reduce-scatter outside pipelining), they are ``at_once`` of the stage's.
- ``received``: a message's buffer from its ``RECV`` to the op that uses it (an F its activation, which then
  counts as that F's activation; a B or I its gradient, held through the op), at the boundary's bytes. This
  is stagewise's runtime, which receives into a fresh tensor; torch's ``PipelineStage`` instead allocates a
  receive buffer for every micro-batch once (stage.py ``_prepare_forward_infra``/``_setup_backward_recv_info``),
  which this does not model.

Sizes: ``Sizes`` (the lowering's options) gives the weights, gradients and boundary bytes; the activations
come from the cost model (``StageCosts.sizes``). With sequence slices a unit holds its slice's share of a
micro-batch's activation (``costs.slice_activation``) and receives 1/k of its boundary.

Example:
    >>> from stagewise.schedules import generate
    >>> from stagewise.parallelism import Parallelism
    >>> from stagewise.lowering import LoweringOptions, Sizes, lower
    >>> low = lower(generate("1f1b", 2, 2), Parallelism(pp=2, fsdp=2),
    ...             LoweringOptions(sizes=Sizes(params=10, boundary=1)))
    >>> low.text(0)
    '0UNSHARD 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD 0RESHARD 0STEP_END'
    >>> m = lowered_memory(low, [2.0, 2.0])
    >>> m[0].peak, m[0].at  # inside 0B0: both activations, the weights, the new gradients, 0RECV_B0's buffer
    (Held(activations=4.0, gathered=10.0, grads=10.0, received=1.0), 6)
    >>> m[0].curve[-2:]  # after the reduce-scatter, then after the reshard
    ((9, Held(activations=0.0, gathered=10.0, grads=0.0, received=0.0)), (10, Held(activations=0.0, gathered=0.0, grads=0.0, received=0.0)))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

from ..actions import MEMORY_KINDS, OFFLOAD, RECOMPUTE, RELOAD, Action, Pair
from ..costs import freed, slice_activation
from ..comm_actions import RECV_B, RECV_F, REDUCE_GRAD, RESHARD, UNSHARD, CommAction
from .lower import Lowered

#: the kinds a rank holds, in ``Held``'s order
KINDS = ("activations", "gathered", "grads", "received")


class Held(NamedTuple):
    """Bytes (or chunk-units) held by kind."""

    activations: float = 0.0
    gathered: float = 0.0
    grads: float = 0.0
    received: float = 0.0

    @property
    def total(self) -> float:
        return self.activations + self.gathered + self.grads + self.received


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """One rank's memory over its lowered program: ``curve`` holds (position in the program, what is held after
    it) wherever that changes; ``peak`` what is held at the highest level, first reached at ``at``."""

    curve: tuple[tuple[int, Held], ...]
    peak: Held
    at: int

    def to_dict(self) -> dict:
        return {"peak": self.peak.total, "parts": self.peak._asdict(), "at": self.at}


def at_once(shares: Sequence[float]) -> float:
    """Of a stage whose layers have these shares, the most a layer-by-layer rhythm holds at once: the layer
    computing and the one fetched or reduced beside it, the largest sum of two neighbours (one layer: all).

    >>> at_once((0.25, 0.5, 0.25)), at_once((1.0,))
    (0.75, 1.0)
    """
    return max(a + b for a, b in zip(shares, shares[1:])) if len(shares) > 1 else sum(shares)


def events(program, free_at_i: float = 0.0, window: Sequence[float] | None = None,
           per_layer: bool = False, mb_factor: Sequence[float] | None = None,
           kept: Sequence[float] | None = None, share=None,
           part: float = 1.0) -> Iterator[tuple[int, int, int, float]]:
    """The rank's holdings as they change, in program order: (position, kind (``KINDS`` index), stage, amount
    per unit of that kind's size at that stage). A received buffer's stage is the boundary's: the stage that
    sent an activation (``s - 1`` for ``RECV_F`` of s), or whose input gradient came back (s for ``RECV_B``).

    ``window``: per stage, ``at_once`` of its layers' shares. A stage gathered ``per_layer`` (reshard after
    forward: FSDP2 frees each layer after it ran) holds that share of its weights; gradients that the op making
    the first of them also reduces bucket by bucket (``during`` it: no earlier backward accumulated any) are
    that share of the stage's, each layer's freed once reduced. ``mb_factor``: per micro-batch, a factor on its
    activation and received buffers (its tokens: ``Costs.mb_activation``; None: 1). ``kept``: per stage, the
    share of its activation the F of a unit with a RECOMPUTE keeps (default none).

    ``share``: with sequence slices, unit -> the share of a micro-batch's activation its slice keeps; ``part``:
    the share of a boundary one unit's message carries (1/k)."""
    def tok(mb) -> float:
        return mb_factor[mb] if mb_factor is not None and 0 <= mb < len(mb_factor) else 1.0

    def one(mb) -> float:  # a unit's activation, in micro-batch activations
        return tok(mb) * (share(mb) if share is not None else 1.0)

    gathered: set[int] = set()
    redone = {(a.stage, a.mb) for a in program if type(a) is Action and a.kind == RECOMPUTE}
    graded: dict[int, float] = {}  # sharded stages whose unsharded gradients exist -> the share held
    sharded = any(type(a) is CommAction and a.kind == UNSHARD and a.group == "fsdp" for a in program)
    bucketed = _reduced_during(program) if window is not None else set()
    waiting: dict[tuple, int] = {}  # (direction, stage, mb) -> the boundary stage of a received buffer
    for k, op in enumerate(program):
        if type(op) is CommAction:
            kind = op.kind
            if kind == RECV_F or kind == RECV_B:
                b = op.stage - 1 if kind == RECV_F else op.stage
                waiting[("F" if kind == RECV_F else "B", op.stage, op.mb)] = b
                yield k, 3, b, tok(op.mb) * part
            elif kind == UNSHARD and op.group == "fsdp" and op.stage not in gathered:
                gathered.add(op.stage)
                yield k, 1, op.stage, window[op.stage] if per_layer else 1.0
            elif kind == RESHARD and op.stage in gathered:
                gathered.discard(op.stage)
                yield k, 1, op.stage, -(window[op.stage] if per_layer else 1.0)
            elif kind == REDUCE_GRAD and op.stage in graded:
                yield k, 2, op.stage, -graded.pop(op.stage)
            continue
        for a in ((op.forward, op.backward) if type(op) is Pair else (op,)):
            kind, s, mb = a
            if kind == "F":
                b = waiting.pop(("F", s, mb), None)
                if b is not None:  # becomes this F's input: counted in its activation from here
                    yield k, 3, b, -tok(mb) * part
                yield k, 0, s, one(mb) * ((kept[s] if kept is not None else 0.0) if (s, mb) in redone else 1.0)
                continue
            if kind in MEMORY_KINDS:
                yield k, 0, s, one(mb) * (-1.0 if kind == OFFLOAD else 1.0 if kind == RELOAD else
                                          1.0 - (kept[s] if kept is not None else 0.0))
                continue
            if sharded and kind != "I" and s not in graded:
                graded[s] = window[s] if (k, s) in bucketed else 1.0
                yield k, 2, s, graded[s]
            b = waiting.pop(("B", s, mb), None) if kind != "W" else None
            yield k, 0, s, -freed(kind, one(mb), free_at_i)
            if b is not None:
                yield k, 3, b, -tok(mb) * part


def _reduced_during(program) -> set[tuple[int, int]]:
    """(op position, stage) of each op that a bucketed reduction of the stage runs during."""
    out, op = set(), -1
    for k, a in enumerate(program):
        if type(a) is not CommAction:
            op = k
        elif a.kind == REDUCE_GRAD and a.during is not False:
            out.add((op, a.stage))
    return out


def sizes_of(low: Lowered, activation: Sequence[float], boundary: Sequence[float] | None = None) -> tuple:
    """Per kind, the size of one unit per stage: the activations given (``StageCosts.sizes``), the weights and
    gradients of ``low``'s ``Sizes``, its boundary bytes (else ``boundary``: the cost model's, else none)."""
    z = low.options.sizes.resolve(low.schedule.stages)
    link = z["boundary"] if z["boundary"] is not None else boundary
    return (list(activation), z["params"], z["grads"], list(link) if link is not None else [0.0] * len(z["params"]))


def lowered_memory(low: Lowered, activation: Sequence[float], free_at_i: float = 0.0,
                   boundary: Sequence[float] | None = None,
                   mb_factor: Sequence[float] | None = None,
                   kept: Sequence[float] | None = None, kv_share: float = 0.0) -> tuple[RankMemory, ...]:
    """Each rank's ``RankMemory`` under ``activation`` (per stage, one micro-batch's, in the unit wanted) and
    ``free_at_i`` (the cost model's), the weights, gradients and boundaries at ``sizes_of``'s; ``mb_factor``
    per micro-batch on its activations and received buffers (``Costs.mb_activation``); ``kept`` per stage
    what the F of a recomputed unit keeps, in ``activation``'s unit (``StageCosts.kept_sizes``); with sequence
    slices each unit's slice share (``kv_share``: the cost model's)."""
    kept_share = [k / a if a else 0.0 for k, a in zip(kept, activation)] if kept is not None else None
    size = sizes_of(low, activation, boundary)
    n = low.schedule.slices
    share = None if n == 1 else (lambda mb: slice_activation(1.0, mb % n, n, kv_share))
    window = [at_once(xs) for xs in low.options.sizes.resolve(low.schedule.stages)["layers"]]
    per_layer = low.parallelism.reshard_after_forward
    out = []
    for prog in low.programs:
        held = [0.0] * len(KINDS)
        curve: list[tuple[int, Held]] = []
        best, at, top = Held(), 0, 0.0
        for k, kind, s, amount in events(prog, free_at_i, window, per_layer, mb_factor, kept_share, share, 1.0 / n):
            held[kind] += amount * size[kind][s]
            now = Held(*held)
            if curve and curve[-1][0] == k:
                curve[-1] = (k, now)
            else:
                curve.append((k, now))
            if now.total > top:
                best, at, top = now, k, now.total
        out.append(RankMemory(curve=tuple(curve), peak=best, at=at))
    return tuple(out)
