"""What every renderer draws: a timeline flattened into cells, plus its title.

A cell is one action placed on its rank's row, times measured from the
timeline's first start (a measured timeline may start at any clock value).
An overlapped F&B pair becomes two cells over the same interval, the forward
in the top half of the row and the backward in the bottom half, so the pair
reads as one overlapped cell while every action keeps its own shape.

A cell is labelled with its micro-batch, or with sequence slices (Seq1F1B) its unit as micro-batch.slice
(``unit_label``: unit 5 of 2 slices is "2.1").

Expert-parallel all-to-all (``Timeline.comm``) is drawn on its own thin lane
under each rank's row (``comm_cells``), and the part the rank waits for is
hatched at the end of its op (``exposed_spans``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..actions import Action, Pair
from ..schedule import Schedule
from ..timeline import Timeline, metrics

WHOLE, TOP, BOTTOM = 0, 1, 2


class Cell(NamedTuple):
    """One action on the picture (hundreds of thousands for big schedules)."""

    rank: int
    start: float
    end: float
    action: Action
    chunk: int  #: index of the action's stage among its rank's stages
    part: int  #: WHOLE, or TOP/BOTTOM half of an overlapped pair


def chunk_of_stage(schedule: Schedule) -> list[int]:
    """Per stage, its position among the stages its rank holds (0 for v=1)."""
    seen = [0] * schedule.ranks
    out = []
    for r in schedule.placement:
        out.append(seen[r])
        seen[r] += 1
    return out


def origin(timeline: Timeline) -> float:
    return timeline.origin


def cells(timeline: Timeline) -> list[Cell]:
    """Every action of ``timeline`` as a cell, rank by rank in program order."""
    chunk = chunk_of_stage(timeline.schedule)
    t0 = origin(timeline)
    out: list[Cell] = []
    for r in range(timeline.ranks):
        for op, start, end in timeline.rows(r):
            s, e = start - t0, end - t0
            if type(op) is Pair:
                fa, ba = op
                out.append(Cell(r, s, e, fa, chunk[fa.stage], TOP))
                out.append(Cell(r, s, e, ba, chunk[ba.stage], BOTTOM))
            else:
                out.append(Cell(r, s, e, op, chunk[op.stage], WHOLE))
    return out


class CommCell(NamedTuple):
    """One action's all-to-all on its rank's lane, times from the origin."""

    rank: int
    start: float
    end: float
    action: Action
    exposed: float  #: the last ``exposed`` seconds of it the rank waits for
    kind: str = "a2a"  #: "a2a", or a lowered transfer's kind (its ``action`` is then the CommAction)


def comm_cells(timeline: Timeline) -> list[CommCell]:
    """Every all-to-all of ``timeline`` (none without ``Timeline.comm``), rank by rank."""
    if timeline.comm is None:
        return []
    t0 = origin(timeline)
    return [CommCell(r, c.start - t0, c.end - t0, c.action, c.exposed, c.kind)
            for r, lane in enumerate(timeline.comm) for c in lane]


def comm_label(c: CommCell) -> str:
    """What a lane cell is, in words: "all-to-all of 0F0", or a lowered transfer ("the all-gather of stage 0
    over fsdp", ``comm_actions.describe``)."""
    if c.kind == "a2a":
        return f"all-to-all of {c.action}"
    from ..comm_actions import describe

    return describe(c.action, c.rank)


def comm_colours(c: CommCell) -> tuple[str, str]:
    """(hidden, exposed) colours of a lane cell: the all-to-all's, or lowered communication's."""
    from . import palette

    return (palette.A2A_HIDDEN, palette.A2A) if c.kind == "a2a" else (palette.COMM_HIDDEN, palette.COMM)


def exposed_spans(timeline: Timeline) -> list[tuple[int, float, float]]:
    """(rank, start, end) of the all-to-all each op exposes, drawn at the op's end (its compute is done); a
    lowered transfer's exposed time is idle time, not part of an op, and is not drawn here."""
    if timeline.comm is None:
        return []
    t0 = origin(timeline)
    out = []
    for r, lane in enumerate(timeline.comm):
        per_op: dict[int, float] = {}
        for c in lane:
            if c.kind != "a2a":
                continue
            per_op[c.op] = per_op.get(c.op, 0.0) + c.exposed
        for k, x in per_op.items():
            if x > 0:
                end = timeline.ends[r][k] - t0
                out.append((r, end - x, end))
    return out


def unit_label(mb: int, slices: int = 1) -> str:
    """A cell's label: its micro-batch, or with slices its micro-batch.slice.

    >>> unit_label(3), unit_label(5, 2)
    ('3', '2.1')
    """
    if slices == 1:
        return str(mb)
    return "%d.%d" % divmod(mb, slices)


def tooltip(cell: Cell, unit: str, slices: int = 1) -> str:
    """'2F3 stage 2 mb 3 0..1 t_f' (the contract of the SVG tooltips); with slices '2F5 stage 2 mb 2 slice 1 ...'."""
    a = cell.action
    mb = f"mb {a.mb}" if slices == 1 else "mb %d slice %d" % divmod(a.mb, slices)
    return f"{a} stage {a.stage} {mb} {cell.start:.6g}..{cell.end:.6g} {unit}"


@dataclass(frozen=True, kw_only=True)
class Summary:
    """The numbers a picture's title shows."""

    name: str
    ranks: int
    microbatches: int
    chunks: int
    makespan: float
    bubble: float
    peak: tuple[float, ...]  #: peak live activations per rank (chunk-units)
    unit: str
    source: str
    kinds: tuple[str, ...]  #: action kinds present, in F B I W order
    pairs: bool  #: whether any op is an overlapped F&B pair
    cap_note: str = ""  #: "cap 4 chunk-units: within" when a memory cap was given
    a2a: float = 0.0  #: all-to-all of all ranks
    a2a_exposed: float = 0.0  #: exposed all-to-all of the rank that exposes most
    a2a_hidden: float = 0.0  #: share of all all-to-all hidden behind compute
    transfers: bool = False  #: whether the lane holds lowered communication (gathers, reductions, sends)
    slices: int = 1  #: sequence slices per micro-batch (``microbatches`` counts micro-batches)

    @property
    def comm(self) -> bool:
        """Whether the picture has an all-to-all lane."""
        return self.a2a > 0

    @property
    def comm_note(self) -> str:
        """"a2a: 8 exposed per rank (max), 39% hidden"; empty without all-to-all."""
        if not self.comm:
            return ""
        return f"a2a: {self.a2a_exposed:.4g} exposed per rank (max), {self.a2a_hidden:.0%} hidden"

    @property
    def peak_max(self) -> float:
        return max(self.peak, default=0.0)

    @property
    def title(self) -> str:
        k = f" k={self.slices} slices" if self.slices > 1 else ""
        return (f"{self.name} · p={self.ranks} m={self.microbatches}{k} v={self.chunks} · "
                f"bubble {self.bubble:.1%} · peak activations {self.peak_max:g}")

    @property
    def subtitle(self) -> str:
        if len(self.peak) <= 12:
            peaks = "peak per rank " + " ".join(f"{x:g}" for x in self.peak)
        else:  # too many ranks to list on one line
            peaks = f"peak per rank {min(self.peak):g} to {max(self.peak):g}"
        cap = f"; {self.cap_note}" if self.cap_note else ""
        comm = f"; {self.comm_note}" if self.comm_note else ""
        return f"{self.source}; makespan {self.makespan:.4g} {self.unit}; {peaks}{cap}{comm}"


def cap_note(mt) -> str:
    """"cap 4 chunk-units: within" (or "over on 2 ranks"); empty without a cap."""
    if mt.memory_cap is None:
        return ""
    over = sum(x > c * (1 + 1e-9) for x, c in zip(mt.peak_in_cap_unit, mt.memory_cap))
    unit = "B" if mt.cap_unit == "bytes" else "chunk-units"
    caps = sorted(set(mt.memory_cap))
    cap = f"{caps[0]:.4g}" if len(caps) == 1 else f"{caps[0]:.4g}..{caps[-1]:.4g}"
    return f"cap {cap} {unit}: " + ("within" if not over else f"over on {over} rank{'s' if over > 1 else ''}")


def summary(timeline: Timeline) -> Summary:
    sched = timeline.schedule
    mt = metrics(timeline)
    present = {a.kind for a in sched.actions()}
    return Summary(
        name=sched.name, ranks=sched.ranks, microbatches=sched.microbatches // sched.slices, chunks=sched.chunks,
        slices=sched.slices,
        makespan=mt.makespan, bubble=mt.bubble_fraction, peak=mt.peak_activations,
        unit=timeline.unit, source=timeline.source,
        kinds=tuple(k for k in "FBIW" if k in present),
        pairs=any(type(op) is Pair for prog in sched.programs for op in prog),
        cap_note=cap_note(mt),
        a2a=sum(mt.a2a),
        a2a_exposed=max(mt.exposed_a2a, default=0.0),
        a2a_hidden=sum(mt.hidden_a2a) / sum(mt.a2a) if sum(mt.a2a) else 0.0,
        transfers=bool(mt.comm),
    )


def ticks(span: float, target: int = 8) -> list[float]:
    """Round tick positions 0, step, 2*step, ... <= span (1-2-5 steps)."""
    if span <= 0:
        return [0.0]
    raw = span / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(k * mag for k in (1, 2, 5, 10) if k * mag >= raw)
    n = int(span / step + 1e-9)
    return [i * step for i in range(n + 1)]


def tick_label(x: float) -> str:
    return f"{x:.6g}"


def memory_envelope(steps: list[tuple[float, float]], per_unit: float) -> list[tuple[float, float]]:
    """At most one step per pixel (``per_unit`` pixels per time unit): the highest level in it.

    A step curve with many steps per pixel draws the same and weighs far less;
    a curve with fewer steps than pixels is returned unchanged.
    """
    if per_unit <= 0 or len(steps) < 2 or (steps[-1][0] - steps[0][0]) * per_unit >= len(steps):
        return steps
    out: list[tuple[float, float]] = []
    column, level = None, 0.0
    for t, lv in steps:
        c = int(t * per_unit)
        if c != column:  # the level held into this pixel counts too
            out.append((c / per_unit, max(level, lv)))
            column = c
        elif lv > out[-1][1]:
            out[-1] = (out[-1][0], lv)
        level = lv
    return out


def memory_steps(timeline: Timeline, rank: int) -> list[tuple[float, float]]:
    """Live activations on ``rank`` as (time from origin, level) steps."""
    t0 = origin(timeline)
    return [(max(0.0, t - t0), level) for t, level in timeline.memory_curve(rank)]
