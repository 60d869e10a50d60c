"""The cost and memory model the simulator plays a schedule against.

Durations are per action (one stage, one micro-batch). The seed convention is
``t_f = 1, t_b = 2``; ``t_i`` and ``t_w`` default to half of ``t_b``. Any
duration may be one number or one number per stage, which is how uneven layers
(a heavy embedding or head) reach the simulator.

Communication is its own resource: ``a2a`` is the expert-parallel all-to-all
time of a forward (dispatch and combine of the stage's MoE layers), mirrored by
the backward (B or I; W has none); ``expert_all_to_all`` derives it from the
model's shape and the link. A plain action pays its compute and its all-to-all
in turn; an overlapped F&B pair hides one half's all-to-all behind the other's
compute (``all_to_all.pair_time``), so its duration is derived; ``t_fb`` still sets
it by hand (without all-to-all only: the two do not mix).

Memory, as the Zero Bubble paper models it: F allocates a stage's activation
(M_B); I frees ``free_at_i`` of it; W frees the rest (M_W, what the weight
gradient still needs); a full B frees it all (``freed``). Memory actions (``actions.MEMORY_KINDS``) move a
unit's activation to the host and back over the host link, ``host_bandwidth`` bytes per time unit (chunk-units
per time unit when the sizes are not in bytes: ``activation_bytes`` unset), on the rank's host stream; a
placed ``RECOMPUTE`` takes its stage's forward time, all-to-all included, and the F of a recomputed unit keeps
``recompute_keep`` of its activation. Sizes are per stage
in chunk-units (one micro-batch's activations of one stage) and, when known,
bytes (``transformer_activation`` gives the paper's M_B and M_W of a GPT
layer). A ``MemoryCap`` bounds each rank's peak in either unit.

Micro-batches need not be alike (variable sequence lengths): ``mb_time`` is one factor per micro-batch
(pipeline unit) on every compute duration of that micro-batch (F, B, I, W, a recomputed forward's replay,
an F&B pair's half), and ``mb_activation`` one on what scales with its tokens: its activation size, the
bytes of its boundary messages and its all-to-all (dispatch and combine carry tokens, so their time goes
with tokens, not with attention's square); ``stagewise.lengths`` turns lengths into both. None is 1
everywhere: every result, closed forms included, is what it was without them.

Sequence slices (Seq1F1B, ``Schedule.slices = k``): the costs still describe one micro-batch; a slice is a
unit of 1/k of its compute (the paper's computation-wise partition cuts slices of equal compute) and 1/k of the
message it sends, and keeps ``slice_activation``: its own 1/k of the activations plus a copy of the keys and
values of the slices before it that it attends to (``kv_share`` of the micro-batch's activations are keys and
values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections import namedtuple
from collections.abc import Sequence
from .actions import HOST_KINDS as _HOST
from .errors import StagewiseError

Num = float | int
PerStage = Num | Sequence[Num] | None


class CostError(StagewiseError):
    """A cost option that makes no sense (negative, wrong length)."""


@dataclass(frozen=True, kw_only=True)
class Costs:
    """Per-action durations, links and activation sizes. Field docs give units."""

    t_f: PerStage = 1.0  #: forward time of one stage for one micro-batch
    t_b: PerStage = 2.0  #: full backward (input + weight gradients)
    t_i: PerStage = None  #: input-gradient backward; default t_b / 2
    t_w: PerStage = None  #: weight-gradient backward; default t_b / 2
    t_fb: PerStage = None  #: overlapped F&B pair, by forward stage, set by hand; default derived (overlap.pair_time)
    #: expert-parallel all-to-all time of one forward action: dispatch + combine of the stage's MoE layers
    a2a: PerStage = 0.0
    a2a_b: PerStage = None  #: the same for a backward (B or I); default a2a (gradients retrace the routes)
    latency: float = 0.0  #: fixed time of one point-to-point message between ranks
    bandwidth: float | None = None  #: bytes per time unit of a link; None = free
    boundary_bytes: PerStage = 0.0  #: bytes of the activation a stage sends on (= its gradient back)
    activation: PerStage = 1.0  #: activations one stage keeps per micro-batch (chunk-units)
    activation_bytes: PerStage = None  #: the same in bytes, when known
    #: fraction of a stage's activations freed at I (rest at W); negative when I holds more until W
    #: (the output gradients W needs: the runtime measures about -0.6 on its GPT)
    free_at_i: float = 0.0
    #: share of a micro-batch's activations on a stage that are attention keys and values: a sequence slice also
    #: keeps those of the slices before it, which it attends to (``slice_activation``)
    kv_share: float = 0.0
    recompute: bool | Sequence[bool] = False  #: stages that keep only their input and redo F in B
    recompute_keep: PerStage = 0.0  #: activation (chunk-units) kept by a recomputed stage
    #: bytes per time unit of a rank's device<->host link (OFFLOAD, RELOAD; chunk-units per time unit when
    #: ``activation_bytes`` is unset); None = free
    host_bandwidth: float | None = None
    cap: "MemoryCap | None" = None  #: most activation each rank may hold (reported; `auto` searches under it)
    #: communication as actions (``lowering.Communication``: the layout, sizes, network and overlap rule); the
    #: simulator then plays the lowered programs, transfers on their own resources. None: links and a2a only
    comm: "object | None" = None
    #: one factor per micro-batch (pipeline unit) on each compute duration of that micro-batch
    #: (``lengths.factors``: a long sequence takes longer); None: 1 for every micro-batch
    mb_time: Sequence[float] | None = None
    #: one factor per micro-batch on its activation size, the bytes it sends and its all-to-all (its tokens)
    mb_activation: Sequence[float] | None = None

    def resolve(self, stages: int, microbatches: int | None = None, slices: int = 1) -> "StageCosts":
        """Per-stage lists for a schedule with ``stages`` stages (and ``microbatches`` pipeline units, which
        the per-micro-batch factors are checked against when given); with ``slices`` k, the durations and
        message bytes of one unit (1/k of a micro-batch's) and the activations of a whole micro-batch
        (``StageCosts.unit_size`` gives a slice's)."""
        if not 0 <= self.kv_share <= 1:  # also NaN
            raise CostError(f"--kv-share must be between 0 and 1; got {self.kv_share}")
        sc = self._resolve(stages, microbatches)
        if slices == 1:
            return sc
        part = 1.0 / slices

        def unit(xs):
            return None if xs is None else [x * part for x in xs]

        return replace(sc, f=unit(sc.f), b=unit(sc.b), i=unit(sc.i), w=unit(sc.w), fb=unit(sc.fb),
                       message=self._message_times(per_stage("boundary_bytes", self.boundary_bytes, stages), part),
                       a2a_f=unit(sc.a2a_f), a2a_b=unit(sc.a2a_b), slices=slices, kv_share=self.kv_share)

    def _message_times(self, link: list[float], part: float = 1.0) -> list[float]:
        """Per stage, the time of its boundary message of ``link`` bytes: the latency, then ``part`` of the bytes
        (a slice's 1/k) over the bandwidth."""
        return [self.latency + (b * part / self.bandwidth if self.bandwidth else 0.0) for b in link]

    def _resolve(self, stages: int, microbatches: int | None) -> "StageCosts":
        f = per_stage("t_f", self.t_f, stages)
        b = per_stage("t_b", self.t_b, stages)
        i = per_stage("t_i", self.t_i, stages, [x / 2 for x in b])
        w = per_stage("t_w", self.t_w, stages, [x / 2 for x in b])
        rec = _bools("recompute", self.recompute, stages)
        # recomputation re-runs the forward inside the backward (B, or I when split)
        b = [x + fx if r else x for x, fx, r in zip(b, f, rec)]
        i = [x + fx if r else x for x, fx, r in zip(i, f, rec)]
        fb = per_stage("t_fb", self.t_fb, stages, None) if self.t_fb is not None else None
        a2a_f = per_stage("a2a", self.a2a, stages)
        a2a_b = per_stage("a2a_b", self.a2a_b, stages, a2a_f)
        # a recomputed stage replays its forward, all-to-alls included, inside the backward
        a2a_b = [x + fx if r else x for x, fx, r in zip(a2a_b, a2a_f, rec)]
        if not any(a2a_f) and not any(a2a_b):
            a2a_f = a2a_b = None
        elif fb is not None:
            raise CostError("--tfb sets an F&B pair's duration by hand; with --a2a it is derived from the halves' "
                            "compute and all-to-all: give one of them")
        full = per_stage("activation", self.activation, stages)
        keep = per_stage("recompute_keep", self.recompute_keep, stages)
        act = [k if r else a for a, k, r in zip(full, keep, rec)]
        act_b = kept_b = None
        if self.activation_bytes is not None:
            full_b = per_stage("activation_bytes", self.activation_bytes, stages)
            ratio = [k / a if a else 0.0 for k, a in zip(keep, full)]
            kept_b = [x * q for x, q in zip(full_b, ratio)]
            act_b = [k if r else x for x, k, r in zip(full_b, kept_b, rec)]
        if self.host_bandwidth is not None and not 0 < self.host_bandwidth < math.inf:
            raise CostError(f"--host-bandwidth must be a finite number > 0; got {self.host_bandwidth}")
        moved = act_b if act_b is not None else act  # what an OFFLOAD or RELOAD carries
        host = [x / self.host_bandwidth for x in moved] if self.host_bandwidth else [0.0] * stages
        link = per_stage("boundary_bytes", self.boundary_bytes, stages)
        if not 0 <= self.latency < math.inf:  # also rejects NaN
            raise CostError(f"--latency must be a finite number >= 0; got {self.latency}")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise CostError(f"--bandwidth must be > 0; got {self.bandwidth}")
        if not math.isfinite(self.free_at_i):
            raise CostError(f"--free-at-i must be a finite number; got {self.free_at_i}")
        if self.free_at_i > 1.0:
            raise CostError(f"--free-at-i must be <= 1; got {self.free_at_i}")
        msg = self._message_times(link)
        if self.cap is not None and self.cap.unit == "bytes" and act_b is None:
            raise CostError("--cap-bytes needs the activation sizes in bytes (--activation-bytes or --hidden-size)")
        return StageCosts(f=f, b=b, i=i, w=w, fb=fb, message=msg, activation=act,
                          activation_bytes=act_b, free_at_i=self.free_at_i, a2a_f=a2a_f, a2a_b=a2a_b, host=host,
                          kept=keep, kept_bytes=kept_b, recomputed=rec,
                          latency=self.latency, mb_time=per_microbatch("mb_time", self.mb_time, microbatches),
                          mb_activation=per_microbatch("mb_activation", self.mb_activation, microbatches))


@dataclass(frozen=True, kw_only=True)
class StageCosts:
    """Costs resolved to one value per stage (what the simulator reads).

    ``f``, ``b``, ``i``, ``w`` are compute; the all-to-all is apart (``comm``), and a plain
    action takes both in turn (``duration``).
    """

    f: list[float]
    b: list[float]
    i: list[float]
    w: list[float]
    fb: list[float] | None  #: a pair's duration set by hand; None: derived (``all_to_all.pair_time``)
    message: list[float]  #: time to send stage s's activation (or gradient) to a neighbour rank
    activation: list[float]
    activation_bytes: list[float] | None
    free_at_i: float
    a2a_f: list[float] | None = None  #: all-to-all of a forward per stage; None: no all-to-all anywhere
    a2a_b: list[float] | None = None  #: of a backward (B or I), recomputed forward's included
    latency: float = 0.0  #: the fixed part of ``message`` (the rest is bytes, which scale with tokens)
    mb_time: tuple[float, ...] | None = None  #: per micro-batch (unit), a factor on its durations; None: 1
    mb_activation: tuple[float, ...] | None = None  #: per micro-batch, on its activation and bytes; None: 1
    host: list[float] | None = None  #: per stage, one OFFLOAD's or RELOAD's time on the host link (None: 0)
    kept: list[float] | None = None  #: per stage, what the F of a unit with a placed RECOMPUTE keeps (chunks)
    kept_bytes: list[float] | None = None  #: the same in bytes, when known
    recomputed: list[bool] | None = None  #: stages whose backward replays the forward (``Costs.recompute``)
    slices: int = 1  #: sequence slices per micro-batch: the durations above are one slice's
    kv_share: float = 0.0  #: keys' and values' share of a micro-batch's activations (``slice_activation``)

    def time_factor(self, mb: int | None) -> float:
        """Micro-batch ``mb``'s factor on its durations (1 without factors or without a micro-batch)."""
        return 1.0 if self.mb_time is None or mb is None else self.mb_time[mb]

    def size_factor(self, mb: int | None) -> float:
        """Micro-batch ``mb``'s factor on its activation and the bytes it sends."""
        return 1.0 if self.mb_activation is None or mb is None else self.mb_activation[mb]

    def compute(self, kind: str, stage: int, mb: int | None = None) -> float:
        """Compute time of an action (of micro-batch ``mb``: its factor): a placed RECOMPUTE is its stage's
        forward; OFFLOAD and RELOAD run on the host link (``host``), none of the compute stream's."""
        if kind in _HOST:
            return 0.0
        x = {"F": self.f, "B": self.b, "I": self.i, "W": self.w, "RECOMPUTE": self.f}[kind][stage]
        return x * self.mb_time[mb] if self.mb_time is not None and mb is not None else x

    def comm(self, kind: str, stage: int, mb: int | None = None) -> float:
        """All-to-all seconds of an action: the forward's (a RECOMPUTE's too), the backward's for B and I, none
        for W and the host transfers; it carries tokens, so it scales with ``mb_activation``."""
        if self.a2a_f is None or kind == "W" or kind in _HOST:
            return 0.0
        x = (self.a2a_f if kind == "F" or kind == "RECOMPUTE" else self.a2a_b)[stage]
        return x * self.mb_activation[mb] if self.mb_activation is not None and mb is not None else x

    def host_time(self, stage: int, mb: int | None = None) -> float:
        """One OFFLOAD's or RELOAD's time on the host link: the unit's activation over the host bandwidth."""
        return self.host[stage] * self.size_factor(mb) if self.host is not None else 0.0

    def kept_sizes(self, unit_bytes: bool = False) -> list[float]:
        """What the F of a unit with a placed RECOMPUTE keeps per stage, in chunk-units or bytes."""
        size = self.sizes(unit_bytes)
        kept = self.kept_bytes if unit_bytes and self.activation_bytes else self.kept
        return list(kept) if kept is not None else [0.0] * len(size)

    def duration(self, kind: str, stage: int, mb: int | None = None) -> float:
        """A plain action's time: its compute, then its all-to-all (of micro-batch ``mb``: its factors)."""
        return self.compute(kind, stage, mb) + self.comm(kind, stage, mb)

    def message_of(self, stage: int, mb: int) -> float:
        """Time to send stage ``stage``'s activation of micro-batch ``mb``: the latency, then its bytes."""
        x = self.message[stage]
        if self.mb_activation is None or x <= self.latency:
            return x
        return self.latency + (x - self.latency) * self.mb_activation[mb]

    def sizes(self, unit_bytes: bool = False) -> list[float]:
        """Activation of one micro-batch per stage, in chunk-units or bytes."""
        return self.activation_bytes if unit_bytes and self.activation_bytes else self.activation

    def allocated(self, kind: str, stage: int, unit_bytes: bool = False, unit: int = 0) -> float:
        """What an action of ``kind`` on ``stage`` (of pipeline unit ``unit``) adds to its rank's live activations
        (negative: frees)."""
        size = slice_activation(self.sizes(unit_bytes)[stage], unit % self.slices, self.slices, self.kv_share)
        return size if kind == "F" else -freed(kind, size, self.free_at_i)


def slice_activation(size: float, j: int, k: int, kv_share: float = 0.0) -> float:
    """What slice ``j`` of ``k`` keeps of a micro-batch's activation ``size`` on a stage: its own 1/k, and a copy
    of the keys and values of slices 0..j-1, which its attention reads (``kv_share`` of ``size`` are the keys and
    values of the whole sequence): size / k * (1 + j * kv_share). k = 1: ``size``.

    >>> slice_activation(8.0, 0, 2), slice_activation(8.0, 1, 2, 0.25)
    (4.0, 5.0)
    """
    if k == 1:
        return size
    return size / k * (1.0 + j * kv_share)


def freed(kind: str, size: float, free_at_i: float) -> float:
    """What a backward action frees of an activation of ``size``: all at B, ``free_at_i`` at I, the rest at W."""
    if kind == "B":
        return size
    if kind == "I":
        return size * free_at_i
    return size * (1.0 - free_at_i)


UNITS = ("chunks", "bytes")


@dataclass(frozen=True, kw_only=True)
class MemoryCap:
    """The most activation each rank may hold: one value for all ranks or one per rank.

    >>> MemoryCap(values=(4.0,)).per_rank(3)
    [4.0, 4.0, 4.0]
    """

    values: tuple[float, ...]
    unit: str = "chunks"  #: "chunks" (micro-batches of one stage) or "bytes"

    @property
    def option(self) -> str:
        return "--cap" if self.unit == "chunks" else "--cap-bytes"

    def per_rank(self, ranks: int) -> list[float]:
        """One cap per rank; raises ``CostError`` for a count that is not 1 or ``ranks``, or a value <= 0."""
        if self.unit not in UNITS:
            raise CostError(f"cap unit must be one of {', '.join(UNITS)}; got {self.unit!r}")
        vals = [float(x) for x in self.values]
        if len(vals) == 1:
            vals = vals * ranks
        if len(vals) != ranks:
            raise CostError(f"{self.option} has {len(vals)} values; give one, or one per rank ({ranks})")
        for r, x in enumerate(vals):
            if not 0 < x < float("inf"):  # also NaN
                raise CostError(f"{self.option} must be > 0 and finite (no order runs a forward without memory); "
                                f"got {x:g} for rank {r}")
        return vals


class Activation(namedtuple("Activation", ("m_b", "m_w"))):
    """One micro-batch's activation memory of a stage, in bytes (Qi et al. 2024, Table 1): ``m_b`` allocated by
    F (M_B), ``m_w`` still held after I, until W (M_W)."""

    __slots__ = ()

    @property
    def free_at_i(self) -> float:
        return 1.0 - self.m_w / self.m_b


def transformer_activation(hidden: int, heads: int, seq_length: int, micro_batch_size: int = 1,
                           layers: float = 1) -> Activation:
    """M_B = (34h + 5as) sb and M_W = 32h sb bytes per GPT layer with 16-bit activations (Korthikanti et
    al. 2022, as the Zero Bubble paper uses them), times ``layers``.

    >>> transformer_activation(4096, 32, 2048).free_at_i  # what I frees: the attention scores mostly
    0.719...
    """
    for name, x in (("hidden-size", hidden), ("heads", heads), ("seq-length", seq_length),
                    ("micro-batch-size", micro_batch_size)):
        if not (isinstance(x, int) and x >= 1):
            raise CostError(f"--{name} must be a whole number >= 1; got {x}")
    if not layers > 0:
        raise CostError(f"--layers-per-stage must be > 0; got {layers}")
    sb = seq_length * micro_batch_size
    return Activation(m_b=(34 * hidden + 5 * heads * seq_length) * sb * layers, m_w=32 * hidden * sb * layers)


def transformer_kv_share(hidden: int, heads: int, seq_length: int) -> float:
    """The keys' and values' share of a GPT layer's activations (``Costs.kv_share``): K and V, 2 x 2sbh bytes
    in 16 bits, of M_B = (34h + 5as)sb (Korthikanti et al. 2022, as ``transformer_activation``).

    >>> round(transformer_kv_share(4096, 32, 2048), 4)
    0.0522
    """
    return 4 * hidden / (34 * hidden + 5 * heads * seq_length)


def expert_dispatch_bytes(tokens: int, hidden: int, top_k: int, ep: int, experts_per_rank: int = 1,
                          bytes_per_element: float = 2.0) -> float:
    """Bytes one rank sends to the other ranks of its expert-parallel group in one dispatch all-to-all
    (the combine sends as many back), routing uniform at random.

    Each of the rank's ``tokens`` goes to its ``top_k`` experts among ``ep * experts_per_rank``, once per
    rank that holds any of them (DeepEP and DeepSeek-V3's kernels send a token to a rank once), so the
    other ranks it reaches are ``(ep - 1) * (1 - C(E - e, k) / C(E, k))`` on average; with one expert per
    rank that is ``(ep - 1) k / ep``, the plain count of routed copies that leave the rank.

    >>> expert_dispatch_bytes(4096, 1024, 2, ep=4)  # 3/4 of the 2 copies of each 2 KB token leave
    12582912.0
    """
    for name, x in (("moe-tokens", tokens), ("hidden-size", hidden), ("moe-top-k", top_k), ("ep", ep),
                    ("moe-experts / --ep", experts_per_rank)):
        if not (isinstance(x, int) and not isinstance(x, bool) and x >= 1):
            raise CostError(f"--{name} must be a whole number >= 1; got {x}")
    if not 0 < bytes_per_element < math.inf:
        raise CostError(f"bytes per element must be > 0; got {bytes_per_element}")
    return tokens * hidden * bytes_per_element * expert_copies(top_k, ep, experts_per_rank)


def expert_copies(top_k: int, ep: int, experts_per_rank: int = 1) -> float:
    """How many other ranks of a group of ``ep`` one token reaches on average, its ``top_k`` experts drawn
    uniformly from the ``ep * experts_per_rank``: (ep - 1) (1 - C(E - e, k) / C(E, k)).

    >>> round(expert_copies(8, 8, 32), 2)  # DeepSeek-V3's 256 experts, top-8, over 8 nodes: 4.6 other nodes
    4.63
    """
    experts = ep * experts_per_rank
    if top_k > experts:
        raise CostError(f"--moe-top-k ({top_k}) must be at most the experts of the group, --moe-experts "
                        f"({experts})")
    # chance that none of a token's k experts is on one given other rank: C(E-e, k) / C(E, k)
    if experts - experts_per_rank < top_k:
        miss = 0.0
    elif top_k <= 4096:  # exact product
        miss = 1.0
        for j in range(top_k):
            miss *= (experts - experts_per_rank - j) / (experts - j)
    else:  # bounded time for any size the options allow: each factor at the midpoint's
        miss = math.exp(top_k * math.log1p(-experts_per_rank / (experts - (top_k - 1) / 2)))
    return (ep - 1) * (1.0 - min(1.0, max(0.0, miss)))


def expert_all_to_all(tokens: int, hidden: int, top_k: int, ep: int, experts_per_rank: int = 1, *,
                      bandwidth: float, latency: float = 0.0, bytes_per_element: float = 2.0,
                      layers: float = 1) -> float:
    """All-to-all time of one forward action: ``layers`` MoE layers, each a dispatch and a combine of
    ``expert_dispatch_bytes`` over a link of ``bandwidth`` bytes per time unit and ``latency``.
    The backward mirrors it (the gradients go back along the same routes).

    >>> expert_all_to_all(4096, 1024, 2, ep=4, bandwidth=50e9)  # seconds, two all-to-alls of 12.6 MB
    0.00050331648
    """
    if not 0 < bandwidth < math.inf:
        raise CostError(f"--a2a-bandwidth must be > 0; got {bandwidth}")
    if not 0 <= latency < math.inf:
        raise CostError(f"--a2a-latency must be a finite number >= 0; got {latency}")
    if not 0 < layers < math.inf:
        raise CostError(f"--layers-per-stage must be > 0; got {layers}")
    one = latency + expert_dispatch_bytes(tokens, hidden, top_k, ep, experts_per_rank, bytes_per_element) / bandwidth
    total = 2 * one * layers if ep > 1 else 0.0
    if not math.isfinite(total):
        raise CostError(f"the all-to-all of --moe-tokens {tokens} x --hidden-size {hidden} over --a2a-bandwidth "
                        f"{bandwidth:g} is not a finite time; count time in a larger unit (so the bandwidth per unit is larger)")
    return total


def with_transformer_memory(costs: Costs, act: Activation) -> Costs:
    """``costs`` whose activation bytes per stage and ``free_at_i`` are the transformer's (M_B, M_W)."""
    from dataclasses import replace

    return replace(costs, activation_bytes=act.m_b, free_at_i=act.free_at_i)


def per_stage(name: str, value: PerStage, stages: int, default: list[float] | None = None) -> list[float]:
    """One float per stage from a number or a sequence; checks sign and length."""
    if value is None:
        if default is None:
            raise CostError(f"--{_opt(name)} is required")
        return list(default)
    if isinstance(value, (int, float)):
        vals = [float(value)] * stages
    else:
        vals = [float(x) for x in value]
        if len(vals) != stages:
            raise CostError(f"--{_opt(name)} has {len(vals)} per-stage values; the schedule has {stages} stages")
    for s, x in enumerate(vals):
        if not 0 <= x < math.inf:  # also rejects NaN: every time and size must be a finite number
            raise CostError(f"--{_opt(name)} must be a finite number >= 0; got {x} (stage {s})")
    return vals


def per_microbatch(name: str, value: Sequence[float] | None, microbatches: int | None) -> tuple[float, ...] | None:
    """One finite factor >= 0 per micro-batch (pipeline unit) from ``value`` (None stays None); its count is
    checked against ``microbatches`` when that is given."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise CostError(f"`{name}` must be a list of numbers, one per micro-batch; got {type(value).__name__}")
    try:
        vals = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        raise CostError(f"`{name}` must be a list of numbers, one per micro-batch") from None
    if microbatches is not None and len(vals) != microbatches:
        raise CostError(f"`{name}` has {len(vals)} values; the schedule has {microbatches} micro-batches "
                        f"(pipeline units): give one per micro-batch")
    for mb, x in enumerate(vals):
        if not 0 <= x < math.inf:  # also NaN
            raise CostError(f"`{name}` must be finite numbers >= 0; got {x} (micro-batch {mb})")
    return vals


def _bools(name: str, value, stages: int) -> list[bool]:
    if isinstance(value, bool):
        return [value] * stages
    vals = [bool(x) for x in value]
    if len(vals) != stages:
        raise CostError(f"--{_opt(name)} has {len(vals)} per-stage values; the schedule has {stages} stages")
    return vals


def _opt(name: str) -> str:
    return {"t_f": "tf", "t_b": "tb", "t_i": "ti", "t_w": "tw", "t_fb": "tfb"}.get(name, name.replace("_", "-"))


def rank_share_weights(schedule) -> list[float]:
    """Cost factor per stage when durations describe one rank's share of the model.

    A stage holding 1/n of its model copy (its lane) costs ``ranks / n`` of a
    rank's share: 1 for one stage per rank, 1/v for v chunks, so schedules with
    different v are compared on the same model.
    """
    weights = [1.0] * schedule.stages
    for lane in schedule.lanes:
        for s in lane.stages:
            weights[s] = schedule.ranks / len(lane.stages)
    return weights


def scaled(costs: Costs, weights: list[float], *, durations: bool = True, activation: bool = True) -> Costs:
    """``costs`` with its durations and/or activation sizes times a per-stage weight.

    A uniform weight keeps scalars scalar, so the closed forms still apply.
    """
    from dataclasses import replace

    uniform = len(set(weights)) == 1

    def times(name, x):
        if x is None:
            return None
        if isinstance(x, (int, float)):
            return x * weights[0] if uniform else [x * w for w in weights]
        return [v * w for v, w in zip(per_stage(name, x, len(weights)), weights)]

    fields = {k: times(k, getattr(costs, k)) for k in ("t_f", "t_b", "t_i", "t_w", "t_fb", "a2a", "a2a_b")} \
        if durations else {}
    if durations and costs.comm is not None:  # the model's sizes are one rank's share too
        fields["comm"] = costs.comm.scaled(weights)
    if activation:
        fields["activation"] = times("activation", costs.activation)
        if costs.activation_bytes is not None:
            fields["activation_bytes"] = times("activation_bytes", costs.activation_bytes)
    return replace(costs, **fields)
