"""Measured timelines, and the simulator's prediction from measured costs.

Each rank marks the start and end of every op (wall clock on CPU, CUDA events
on GPU) relative to its own origin taken right after a step-start barrier, so
ranks line up to within the barrier's release skew. Rank 0 gathers the marks
into a ``Timeline(source="measured", unit="s")`` of the same schedule the
simulator plays: the renderers and metrics read it unchanged. With a flight recorder each rank's sends,
receives and collectives (gathers, reductions, the tied-weight sum, the step end), named as the lowered program
the executor walked names them, come along as its communication lane: the simulated lowered timeline's lane,
action for action.
"""

from __future__ import annotations

import time
from statistics import fmean
from typing import Sequence

from ...actions import Pair
from ...costs import Costs
from ...comm_actions import CommAction, parse_comm
from ...all_to_all import Comm
from ...schedule import Schedule
from ...simulate import simulate
from ...timeline import Timeline, metrics


class WallClock:
    """perf_counter marks. Mutable: the step origin."""

    def start(self) -> None:
        self.origin = time.perf_counter()

    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, marks: list) -> list[tuple[float, float]]:
        return [(a - self.origin, b - self.origin) for a, b in marks]


class CudaClock:
    """CUDA event marks, resolved after one synchronize at step end. Mutable: the origin event."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device

    def start(self) -> None:
        self.origin = self._event()

    def mark(self):
        return self._event()

    def seconds(self, marks: list) -> list[tuple[float, float]]:
        self.torch.cuda.synchronize(self.device)
        at = self.origin.elapsed_time
        return [(at(a) / 1e3, at(b) / 1e3) for a, b in marks]

    def _event(self):
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev


def measured_timeline(schedule: Schedule, per_rank: Sequence[Sequence[tuple[float, float]]],
                      comms: Sequence[Sequence[tuple]] | None = None) -> Timeline:
    """A Timeline from each rank's (start, end) seconds, aligned with its program; ``comms``: each rank's
    transfers and collectives as (op, action, start, end, seconds waited) (``named``), drawn on its
    communication lane like a simulated lowered timeline's (issued to done: their time in flight; exposed: what
    the rank waited for them)."""
    lanes = None
    if comms is not None:
        lanes = tuple(tuple(Comm(max(op, 0), a, start, end, exposed, a.kind)  # play.lanes: the op before it
                            for op, a, start, end, exposed in rank) for rank in comms)
        lanes = lanes if any(lanes) else None  # nothing communicated: no lanes, as simulated
    return Timeline(
        schedule=schedule,
        starts=tuple(tuple(s for s, _ in rows) for rows in per_rank),
        ends=tuple(tuple(e for _, e in rows) for rows in per_rank),
        source="measured",
        unit="s",
        comm=lanes,
    )


def named(comms, program) -> list[tuple]:
    """``flight.intervals`` of one rank as (op, CommAction, start, end, exposed): each name as the action of the
    rank's lowered ``program`` that the executor ran (in its order: its group and op, what the pictures and
    explain say), or as parsed where the program has none (the step end's tied-weight sum)."""
    queue: dict[str, list] = {}
    for a in program:
        if type(a) is CommAction:
            queue.setdefault(str(a), []).append(a)
    out = []
    for op, text, start, end, exposed in comms:
        same = queue.get(text)
        a = same.pop(0) if same else parse_comm(text)
        if a is not None:
            out.append((op, a, start, end, exposed))
    return out


def mean_costs(timelines: Sequence[Timeline]) -> Costs:
    """Per-stage mean duration of each action kind (F&B pairs by their forward's stage)."""
    S = timelines[0].schedule.stages
    seen: dict[tuple[str, int], list[float]] = {}
    for tl in timelines:
        for r in range(tl.ranks):
            for op, start, end in tl.rows(r):
                key = ("F&B", op.forward.stage) if type(op) is Pair else (op.kind, op.stage)
                seen.setdefault(key, []).append(end - start)
    mean = {k: fmean(v) for k, v in seen.items()}

    def per(kind: str, fallback) -> list[float]:
        return [mean.get((kind, s), fallback(s)) for s in range(S)]

    t_f = per("F", lambda s: 0.0)
    t_i = per("I", lambda s: None)
    t_w = per("W", lambda s: None)
    t_b = per("B", lambda s: (t_i[s] or 0.0) + (t_w[s] or 0.0))
    t_i = [x if x is not None else b / 2 for x, b in zip(t_i, t_b)]
    t_w = [x if x is not None else b / 2 for x, b in zip(t_w, t_b)]
    has_pairs = any(k == "F&B" for k, _ in mean)
    t_fb = per("F&B", lambda s: t_f[s] + t_b[s]) if has_pairs else None
    return Costs(t_f=t_f, t_b=t_b, t_i=t_i, t_w=t_w, t_fb=t_fb)


def predicted(timelines: Sequence[Timeline]):
    """The simulator's metrics of the measured steps' schedule, fed their mean cost of each action kind."""
    return metrics(simulate(timelines[0].schedule, mean_costs(timelines)))


def bubbles(timelines: Sequence[Timeline]) -> tuple[float, float]:
    """(measured, predicted) bubble fraction: mean over the timelines, and the simulator fed their mean costs."""
    measured = fmean(metrics(tl).bubble_fraction for tl in timelines)
    return measured, predicted(timelines).bubble_fraction
