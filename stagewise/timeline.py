"""Timelines (start/end of every op on every rank) and the metrics read off them.

A timeline is the same whether simulated or measured: renderers and metrics
never know which. Times are in the cost model's unit (simulated) or seconds
(measured).

With memory actions (``Schedule.memory_actions``) a rank's activations are read off the times, as the host
stream runs beside compute: an F keeps its activation (only ``kept`` of it when the unit has a RECOMPUTE), a
RECOMPUTE brings back the rest at its start, an OFFLOAD frees the activation at its end and a RELOAD allocates
it at its start; at one instant offloads done count first, then reloads, then the compute ops.
OFFLOAD and RELOAD are not busy time (``Metrics.busy``): they are the host link's lane (``comm``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from operator import sub

from . import display
from .actions import HOST_KINDS, OFFLOAD, RECOMPUTE, RELOAD, Pair, actions_of
from .costs import freed, slice_activation
from .all_to_all import Comm, kinds, totals
from .schedule import Schedule


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Start and end of each op of each rank's program (same indexing)."""

    schedule: Schedule
    starts: tuple[tuple[float, ...], ...]
    ends: tuple[tuple[float, ...], ...]
    source: str = "simulated"  #: "simulated" or "measured"
    unit: str = "t_f"  #: time unit for labels ("t_f" for cost-model units, "s" measured)
    activation: tuple[float, ...] = ()  #: chunk-units kept per micro-batch, per stage
    activation_bytes: tuple[float, ...] | None = None
    free_at_i: float = 0.0
    #: per micro-batch (pipeline unit), a factor on its activation (``Costs.mb_activation``); None: 1 for all
    mb_activation: tuple[float, ...] | None = None
    kept: tuple[float, ...] | None = None  #: per stage, what the F of a unit with a RECOMPUTE keeps (chunk-units)
    kept_bytes: tuple[float, ...] | None = None  #: the same in bytes
    kv_share: float = 0.0  #: keys' and values' share of the activations (sequence slices: ``slice_activation``)
    cap: tuple[float, ...] | None = None  #: most activation each rank may hold (None: no cap)
    cap_unit: str = "chunks"  #: "chunks" (compared with peak_activations) or "bytes"
    #: per rank, the all-to-all of each action that has one (its own lane beside compute); None: none
    comm: tuple[tuple[Comm, ...], ...] | None = None
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.activation:
            object.__setattr__(self, "activation", (1.0,) * self.schedule.stages)

    @property
    def ranks(self) -> int:
        return self.schedule.ranks

    def _repr_html_(self) -> str:  # Jupyter; the drawing code loads only when asked (stagewise.display)
        return display.draw(self, "html")

    def _repr_svg_(self) -> str:
        return display.draw(self, "svg")

    @cached_property
    def spans(self) -> tuple[tuple[float, float] | None, ...]:
        """Per rank, (start of its first op, end of its last); None for a rank without ops."""
        return tuple((min(st), max(en)) if st else None for st, en in zip(self.starts, self.ends))

    @property
    def origin(self) -> float:
        """When the step starts: its first op, or its first transfer (a lowered step may gather first)."""
        t0 = min((span[0] for span in self.spans if span), default=0.0)
        return min([t0] + [c.start for lane in self.comm for c in lane]) if self.comm is not None else t0

    @property
    def finish(self) -> float:
        """When the step ends: its last op, or its last transfer (a lowered step reduces after the drain)."""
        t1 = max((span[1] for span in self.spans if span), default=0.0)
        return max([t1] + [c.end for lane in self.comm for c in lane]) if self.comm is not None else t1

    def rows(self, rank: int):
        """(op, start, end) for each op of ``rank`` in program order."""
        return zip(self.schedule.programs[rank], self.starts[rank], self.ends[rank])

    def memory_curve(self, rank: int, unit_bytes: bool = False) -> list[tuple[float, float]]:
        """Live activations on ``rank`` as (time, level) steps, in program order.

        An activation is held from the start of its F to the end of its B
        (or W; ``free_at_i`` of it already at the end of I).
        """
        if self.schedule.memory_actions:
            live, out = 0.0, [(0.0, 0.0)]
            for t, _, delta in self.memory_events(rank, unit_bytes):
                live += delta
                out.append((t, live))
            return out
        size = self.activation_bytes if unit_bytes and self.activation_bytes else self.activation
        held = unit_sizes(self.schedule, size, self.kv_share, self.mb_activation)
        live, out = 0.0, [(0.0, 0.0)]
        for op, start, end in self.rows(rank):
            for a in actions_of(op):
                if a.kind == "F":
                    live += held(a)
                    out.append((start, live))
            for a in actions_of(op):
                if a.kind != "F":
                    live -= freed(a.kind, held(a), self.free_at_i)
                    out.append((end, live))
        return out

    def memory_events(self, rank: int, unit_bytes: bool = False,
                      transfers: bool = True) -> list[tuple[float, float, float]]:
        """(time, order, change) of ``rank``'s live activations, sorted: compute ops in program order (an F's at
        its start, a backward's at its end); at one instant an OFFLOAD's free (at its end: the transfer is done)
        first, and a RELOAD's allocation (at its start; no earlier than its own offload's end) in program order,
        after the frees of the backwards before it (the runtime frees, then reloads). ``transfers``: False leaves
        the OFFLOADs' and RELOADs' events out (what stays on the device whatever moves)."""
        bytes_ = unit_bytes and self.activation_bytes
        size = self.activation_bytes if bytes_ else self.activation
        kept = (self.kept_bytes if bytes_ else self.kept) or (0.0,) * len(size)
        held = unit_sizes(self.schedule, size, self.kv_share, self.mb_activation)
        prog = self.schedule.programs[rank]
        redone = {(a.stage, a.mb) for a in prog if type(a) is not Pair and a.kind == RECOMPUTE}
        out = []
        for k, (op, start, end) in enumerate(self.rows(rank)):
            for a in actions_of(op):
                kind, s, mb = a
                x = held(a)  # the unit's whole activation; a recomputed F keeps its kept share of it
                keep = x * kept[s] / size[s] if size[s] else 0.0
                if kind == "F":
                    out.append((start, 2 * k, keep if (s, mb) in redone else x))
                elif kind == RECOMPUTE:
                    out.append((start, 2 * k, x - keep))
                elif kind == RELOAD:
                    if transfers:
                        out.append((start, 2 * k, x))
                elif kind == OFFLOAD:
                    if transfers:
                        out.append((end, -2, -x))
                else:
                    out.append((end, 2 * k + 1, -freed(kind, x, self.free_at_i)))
        out.sort()
        return out


def unit_sizes(schedule: Schedule, size, kv_share: float = 0.0, mb_factor=None):
    """The activation an action's unit keeps on its stage, as a function of the action: ``size`` per stage;
    with sequence slices what its slice keeps (``costs.slice_activation``); times its micro-batch's factor
    (``Costs.mb_activation``) when micro-batches differ."""
    k = schedule.slices
    if mb_factor is None:
        if k == 1:
            return lambda a: size[a.stage]
        return lambda a: slice_activation(size[a.stage], a.mb % k, k, kv_share)
    if k == 1:
        return lambda a: size[a.stage] * mb_factor[a.mb]
    return lambda a: slice_activation(size[a.stage], a.mb % k, k, kv_share) * mb_factor[a.mb]


def peak_memory(schedule: Schedule, size, free_at_i: float = 0.0, mb_factor=None,
                kv_share: float = 0.0) -> list[float]:
    """Peak live activations per rank; time-free since a rank's ops are sequential. ``mb_factor``: per
    micro-batch (unit), a factor on its activation (``Costs.mb_activation``; None: 1); ``kv_share``: with
    sequence slices, what each slice keeps (``costs.slice_activation``)."""
    if mb_factor is not None or schedule.slices > 1:
        return _unit_peak(schedule, unit_sizes(schedule, size, kv_share, mb_factor), free_at_i)
    # what an action of each kind adds to its rank's activations, per stage: one lookup per op on the hot path
    # of every metrics call (adding -x is subtracting x, bit for bit); any other kind frees as ``freed``'s W
    frees_w = [-freed("W", x, free_at_i) for x in size]
    adds = defaultdict(lambda: frees_w, {"F": size, "W": frees_w,
                                         **{k: [-freed(k, x, free_at_i) for x in size] for k in "BI"}})
    peaks = []
    for prog in schedule.programs:
        live = peak = 0.0
        for op in prog:
            if type(op) is Pair:
                fa, ba = op
                live += size[fa.stage]
                peak = live if live > peak else peak
                live -= freed(ba.kind, size[ba.stage], free_at_i)
                continue
            kind, s, _ = op
            live += adds[kind][s]
            if live > peak:  # after a backward too: I grows what it keeps when free_at_i < 0
                peak = live
        peaks.append(peak)
    return peaks


def _unit_peak(schedule: Schedule, held, free_at_i: float) -> list[float]:
    """``peak_memory`` where units differ (slices, micro-batch factors): ``held``, action -> its unit's size."""
    peaks = []
    for prog in schedule.programs:
        live = peak = 0.0
        for op in prog:
            for a in actions_of(op):  # a pair: its forward, then its backward (as ``peak_memory``)
                x = held(a)
                live += x if a.kind == "F" else -freed(a.kind, x, free_at_i)
                if live > peak:
                    peak = live
        peaks.append(peak)
    return peaks


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """What a timeline costs: time, idle share, memory."""

    makespan: float
    bubble_fraction: float  #: 1 - busy / (ranks * makespan)
    busy: tuple[float, ...]
    idle: tuple[float, ...]
    peak_activations: tuple[float, ...]  #: chunk-units
    peak_activation_bytes: tuple[float, ...] | None
    param_share: tuple[float, ...]  #: fraction of the whole model's parameters per rank
    #: idle inside each rank's own span (first start to last end): the bubble the Zero
    #: Bubble paper counts once the step-end synchronisation is removed
    span_idle: tuple[float, ...] = ()
    memory_cap: tuple[float, ...] | None = None  #: per rank, in ``cap_unit``
    cap_unit: str | None = None  #: "chunks" or "bytes"
    a2a: tuple[float, ...] = ()  #: expert-parallel all-to-all seconds per rank (hidden or not)
    exposed_a2a: tuple[float, ...] = ()  #: of which the rank's compute waits for (inside ``busy``)
    #: lowered communication (``lowering``) per kind: {"time": per rank, "exposed": per rank}; exposed time
    #: is idle time of the rank spent waiting for it (outside ``busy``), the rest ran beside compute
    comm: dict = field(default_factory=dict)

    @property
    def hidden_a2a(self) -> tuple[float, ...]:
        """All-to-all that ran while the rank computed."""
        return tuple(max(0.0, a - x) for a, x in zip(self.a2a, self.exposed_a2a))

    @property
    def exposed_a2a_fraction(self) -> float:
        """Exposed all-to-all over ranks x makespan: the share of the step it costs, as the bubble is idle's."""
        return sum(self.exposed_a2a) / (len(self.busy) * self.makespan) if self.makespan > 0 else 0.0

    @property
    def peak_in_cap_unit(self) -> tuple[float, ...]:
        return self.peak_activation_bytes if self.cap_unit == "bytes" and self.peak_activation_bytes else \
            self.peak_activations

    @property
    def within_cap(self) -> bool | None:
        """Every rank's peak at most its cap (None: no cap)."""
        if self.memory_cap is None:
            return None
        return all(x <= c * (1 + 1e-9) for x, c in zip(self.peak_in_cap_unit, self.memory_cap))

    def to_dict(self) -> dict:
        return {
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "busy": list(self.busy),
            "idle": list(self.idle),
            "peak_activations": list(self.peak_activations),
            "peak_activation_bytes": list(self.peak_activation_bytes) if self.peak_activation_bytes else None,
            "param_share": list(self.param_share),
            "span_idle": list(self.span_idle),
            "memory_cap": list(self.memory_cap) if self.memory_cap is not None else None,
            "cap_unit": self.cap_unit,
            "within_cap": self.within_cap,
            "a2a": list(self.a2a),
            "exposed_a2a": list(self.exposed_a2a),
            "hidden_a2a": list(self.hidden_a2a),
            "exposed_a2a_fraction": self.exposed_a2a_fraction,
            **({"comm": {k: {"time": list(v["time"]), "exposed": list(v["exposed"]),
                             "hidden": [max(0.0, a - x) for a, x in zip(v["time"], v["exposed"])]}
                         for k, v in self.comm.items()}} if self.comm else {}),
        }


def metrics(tl: Timeline) -> Metrics:
    """Makespan, bubble, busy/idle per rank and peak memory of a timeline."""
    t0, t1 = tl.origin, tl.finish
    makespan = t1 - t0
    busy = tuple(sum(map(sub, en, st)) for st, en in zip(tl.starts, tl.ends))  # e - s of each op, summed in C
    if sched_memory := tl.schedule.memory_actions:  # the host link's transfers run beside compute: not busy
        busy = tuple(sum(e - s for op, s, e in tl.rows(r) if type(op) is Pair or op.kind not in HOST_KINDS)
                     for r in range(tl.ranks))
    idle = tuple(makespan - b for b in busy)
    R = tl.ranks
    bubble = 1.0 - sum(busy) / (R * makespan) if makespan > 0 else 0.0
    sched = tl.schedule
    f = tl.mb_activation
    if sched_memory:
        peak_b = tuple(_timed_peaks(tl, True)) if tl.activation_bytes else None
        peaks = tuple(_timed_peaks(tl, False))
    else:
        peak_b = tuple(peak_memory(sched, tl.activation_bytes, tl.free_at_i, f, tl.kv_share)) \
            if tl.activation_bytes else None
        peaks = tuple(peak_memory(sched, tl.activation, tl.free_at_i, f, tl.kv_share))
    a2a, exposed = totals(tl.comm, R)
    return Metrics(
        makespan=makespan,
        bubble_fraction=bubble,
        busy=busy,
        idle=idle,
        peak_activations=peaks,
        peak_activation_bytes=peak_b,
        param_share=tuple(sched.param_share()),
        span_idle=tuple((span[1] - span[0] - b) if span else 0.0 for span, b in zip(tl.spans, busy)),
        memory_cap=tl.cap,
        cap_unit=tl.cap_unit if tl.cap is not None else None,
        a2a=a2a,
        exposed_a2a=exposed,
        comm={k: dict(zip(("time", "exposed"), totals(tl.comm, R, k))) for k in kinds(tl.comm) if k != "a2a"},
    )


def _timed_peaks(tl: Timeline, unit_bytes: bool) -> list[float]:
    """Per rank, the highest level of ``Timeline.memory_curve`` (a schedule with memory actions)."""
    return [max(level for _, level in tl.memory_curve(r, unit_bytes)) for r in range(tl.ranks)]
