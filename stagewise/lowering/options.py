"""What a lowering needs besides the schedule and the layout: the frameworks' overlap rules, the model's
sizes in bytes, the network.

``Overlap`` is one framework's rule for when a stage's gradient reduction starts and when sharded weights
are gathered (the planner's ``Framework`` holds its framework's, plan/cluster/overlap_rules.py):

- ``reduce``: ``layer`` (Megatron-LM ``--overlap-grad-reduce``: buckets reduced as the stage's last backward
  produces them, so the reduction runs during that backward), ``stage`` (torchtitan, stagewise: after the
  stage's last backward), ``drain`` (DeepSpeed: ``ReduceGrads`` after the rank's pipeline work), ``each``
  (every backward reduces its layers as it leaves them, as ``layer`` does the last one's: FSDP2's own hooks
  with gradient sync left on between micro-batches, torchtitan's gradient accumulation without PP);
- ``gather``: ``layer`` or ``stage`` (ahead of the stage's first forward, prefetched one stage ahead: FSDP2,
  Megatron-LM ``--overlap-param-gather`` for ZeRO-1's updated weights), ``end`` (ZeRO-1's all-gather after
  the optimizer step, exposed: DeepSpeed, stagewise's ZeRO-1);
- ``blocking_p2p``: a send holds its rank until it has arrived (DeepSpeed's ``SendActivation``/``SendGrad``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..costs import CostError, PerStage, per_stage
from ..parallelism import DIMS, Parallelism

#: when a stage's gradient reduction may start
REDUCE = ("layer", "stage", "drain", "each")
#: when sharded weights are all-gathered
GATHER = ("layer", "stage", "end")


@dataclass(frozen=True, kw_only=True)
class Overlap:
    """When reductions start and gathers are issued (see the module docstring)."""

    reduce: str = "stage"  #: of REDUCE: dp all-reduce / ZeRO-1 reduce-scatter
    gather: str = "end"  #: of GATHER: ZeRO-1's updated weights
    fsdp_reduce: str = "stage"  #: of REDUCE: FSDP's reduce-scatter
    fsdp_gather: str = "stage"  #: of GATHER (layer or stage): FSDP's all-gather
    blocking_p2p: bool = False  #: the sender waits for its activation or gradient to arrive (DeepSpeed)

    def __post_init__(self) -> None:
        for name in ("reduce", "fsdp_reduce"):
            if getattr(self, name) not in REDUCE:
                raise CostError(f"`{name}` {getattr(self, name)!r} is not one of {', '.join(REDUCE)}")
        for name in ("gather", "fsdp_gather"):
            if getattr(self, name) not in GATHER:
                raise CostError(f"`{name}` {getattr(self, name)!r} is not one of {', '.join(GATHER)}")
        if self.fsdp_gather == "end":
            raise CostError("`fsdp_gather` 'end': FSDP gathers a stage before it computes (layer or stage)")


#: each framework's rule, written here once (the planner's ``Framework`` values hold these)
FRAMEWORKS = {
    "megatron": Overlap(reduce="layer", gather="layer"),
    "torchtitan": Overlap(reduce="stage", gather="end", fsdp_reduce="stage", fsdp_gather="layer"),
    "deepspeed": Overlap(reduce="drain", gather="end", blocking_p2p=True),
    "stagewise": Overlap(reduce="stage", gather="end", fsdp_reduce="stage", fsdp_gather="stage"),
}


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The model's sizes in bytes, per stage where it says so (one number or one per stage)."""

    params: PerStage = 0.0  #: one stage's parameters on one tensor-parallel rank, unsharded
    grads: PerStage = None  #: its gradients as reduced (default: params)
    boundary: PerStage = None  #: the activation a stage sends on (its gradient comes back alike; default: Costs')
    a2a: PerStage = 0.0  #: one forward's dispatch bytes of the stage's MoE layers (combine sends as many)
    tie: float = 0.0  #: a tied weight's bytes (0: no tie; the first and last stage hold its copies)
    #: per stage, its layers' bytes in model order (any scale: only their shares count): a ``layer`` gather
    #: (``Overlap``) sends the first layer's share ahead of the op and each next one while the layer before it
    #: computes; a ``layer`` reduction sends each layer's as the backward produces it, the first layer's last
    #: (None: one layer per stage)
    layers: tuple | None = None
    step_end: float = 8.0  #: the step-end all-reduces (gradient norm and loss)

    def resolve(self, stages: int) -> dict:
        params = per_stage("param_bytes", self.params, stages)
        out = {"params": params, "grads": per_stage("grad_bytes", self.grads, stages, params),
               "a2a": per_stage("a2a_bytes", self.a2a, stages),
               "layers": _shares(self.layers, stages),
               "boundary": per_stage("boundary_bytes", self.boundary, stages) if self.boundary is not None else None}
        for name in ("tie", "step_end"):
            x = getattr(self, name)
            if not 0 <= x < math.inf:
                raise CostError(f"--{name.replace('_', '-')}-bytes must be a finite number >= 0; got {x}")
        return out


def _shares(layers, stages: int) -> list[tuple[float, ...]]:
    """Per stage, its layers' shares of its bytes (``Sizes.layers``), checked."""
    if layers is None:
        return [(1.0,)] * stages
    if len(layers) != stages:
        raise CostError(f"`layers` has {len(layers)} per-stage entries; the schedule has {stages} stages")
    out = []
    for s, xs in enumerate(layers):
        xs = [float(x) for x in xs]
        total = sum(xs)
        if not xs or not all(0 <= x < math.inf for x in xs) or not 0 < total < math.inf:
            raise CostError(f"`layers` of stage {s} must be finite byte counts >= 0 with a positive sum; got {xs}")
        out.append(tuple(x / total for x in xs))
    return out


@dataclass(frozen=True, kw_only=True)
class Network:
    """Bandwidth (bytes per time unit; None: free) and latency inside a node and across nodes. Ranks are
    numbered in ``order`` (the mesh's, ``parallelism.DIMS``: dp outermost, tp innermost, by default) and fill
    nodes in turn."""

    gpus_per_node: int = 8
    intra_bandwidth: float | None = None
    inter_bandwidth: float | None = None
    intra_latency: float = 0.0
    inter_latency: float = 0.0
    #: the mesh dimensions from outermost to innermost: ``DIMS`` keeps a pipeline inside its data replicas
    #: (torchtitan's mesh, the planner's dense layouts); ``PIPELINE_OUTERMOST`` is Megatron-Core's default order
    #: (tensor, expert, data, then pipeline), the planner's "within" device order
    order: tuple[str, ...] = DIMS

    def __post_init__(self) -> None:
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise CostError(f"--gpus-per-node must be a whole number >= 1; got {self.gpus_per_node!r}")
        for name in ("intra_bandwidth", "inter_bandwidth"):
            x = getattr(self, name)
            if x is not None and not 0 < x < math.inf:
                raise CostError(f"--{name.replace('_', '-')} must be > 0; got {x}")
        for name in ("intra_latency", "inter_latency"):
            x = getattr(self, name)
            if not 0 <= x < math.inf:
                raise CostError(f"--{name.replace('_', '-')} must be a finite number >= 0; got {x}")
        if sorted(self.order) != sorted(DIMS):
            raise CostError(f"`order` {self.order!r} must name each of {', '.join(DIMS)} once")

    def strides(self, par: Parallelism) -> dict[str, int]:
        """How many global ranks apart two neighbours of each mesh dimension sit, in ``order``."""
        out, step = {}, 1
        for dim in reversed(self.order):
            out[dim] = step
            step *= par.size(dim)
        return out

    def link(self, inside: bool) -> tuple[float | None, float]:
        """(bandwidth, latency) inside a node or across."""
        return (self.intra_bandwidth, self.intra_latency) if inside else (self.inter_bandwidth, self.inter_latency)

    def collective(self, op: str, nbytes: float, n: int, inside: bool) -> float:
        """Time of a ring collective over ``n`` ranks of ``nbytes`` (the whole buffer): all-gather and
        reduce-scatter move (n-1)/n of it in n-1 steps, all-reduce twice that; all-to-all sends ``nbytes``
        once (already the part that leaves the rank)."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        bw, lat = self.link(inside)
        rate = 0.0 if bw is None else 1.0 / bw
        if op == "all-to-all":
            return lat + nbytes * rate
        steps = 2 if op == "all-reduce" else 1
        return steps * ((n - 1) * lat + (n - 1) / n * nbytes * rate)


#: which messages carry a header (their shapes, right before their data on the same channel): none (shapes
#: known in advance), the first of each boundary on each channel in a step (its other micro-batches have its
#: shapes), or every one (micro-batches of different shapes: pre-split, variable lengths)
HEADER_RULES = ("none", "first", "every")


#: Megatron-Core's device order (tensor innermost, then expert, data, and the pipeline outermost)
PIPELINE_OUTERMOST = ("pp",) + tuple(d for d in DIMS if d != "pp")


@dataclass(frozen=True, kw_only=True)
class LoweringOptions:
    """Everything ``lower`` reads besides the schedule and the layout."""

    overlap: Overlap = field(default_factory=Overlap)  #: or ``FRAMEWORKS[name]``
    sizes: Sizes = field(default_factory=Sizes)
    network: Network = field(default_factory=Network)
    moe: bool | None = None  #: the stages run MoE layers (None: where ``sizes.a2a`` > 0)
    step_end: bool = True  #: add the step-end all-reduces (gradient norm, loss)
    #: lower the sends and receives; False: each message is the cost model's link time between the ops, as
    #: ``engine.play`` takes it (for a caller whose boundaries carry no bytes: the planner)
    p2p: bool = True
    headers: str = "none"  #: of HEADER_RULES: which messages carry a header (``SEND_F_HDR`` ... before their data)

    def __post_init__(self) -> None:
        if self.headers not in HEADER_RULES:
            raise CostError(f"`headers` {self.headers!r} is not one of {', '.join(HEADER_RULES)}")
