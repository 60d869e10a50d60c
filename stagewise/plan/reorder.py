"""Local search on an order: move one action of a rank a few places while that shortens the objective.

The greedy decides each action when it can start; a swap sees the whole
timeline (a W put off by one slot can let a gradient through earlier, and the
rank before stops waiting). Each neighbour is replayed by the engine, the one
simulator, and kept only if it runs (no wait cycle), stays within the memory
cap and is strictly better. First improvement, sweeping ranks in turn, until a
sweep finds nothing or the deadline passes.
"""

from __future__ import annotations

import time
from typing import Sequence

from ..costs import StageCosts
from ..engine import Stuck, play
from ..schedule import Schedule
from ..timeline import peak_memory

_EPS = 1e-9


def objective(schedule: Schedule, sc: StageCosts, name: str) -> float:
    """The makespan ("step") or the longest rank span ("span") of the order; inf if it cannot run."""
    try:
        starts, ends = play(schedule, sc)
    except Stuck:
        return float("inf")
    if name == "step":
        return max(e[-1] for e in ends if e) - min(s[0] for s in starts if s)
    return max(e[-1] - s[0] for s, e in zip(starts, ends) if s)


def improve(schedule: Schedule, sc: StageCosts, size: Sequence[float], cap: Sequence[float], name: str,
            deadline: float, reach: int = 3) -> tuple[Schedule, float]:
    """The order after hill-climbing on adjacent swaps, and its objective."""
    best = objective(schedule, sc, name)
    programs = [list(p) for p in schedule.programs]
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for r in range(len(programs)):
            prog = programs[r]
            for i in range(len(prog)):
                for j in range(max(0, i - reach), min(len(prog), i + reach + 1)):
                    if time.perf_counter() >= deadline:
                        break
                    if j == i or not _movable(prog, i, j):
                        continue
                    prog.insert(j, prog.pop(i))
                    cand = _with(schedule, programs)
                    value = objective(cand, sc, name) if _fits(cand, r, size, sc.free_at_i, cap) else float("inf")
                    if value < best - _EPS * abs(best):
                        best, improved = value, True
                        break
                    prog.insert(i, prog.pop(j))
    return _with(schedule, programs), best


def _movable(prog, i: int, j: int) -> bool:
    """Moving prog[i] to j passes only actions of other micro-batches and other kinds (no dependency, and
    each kind keeps its micro-batch order)."""
    a = prog[i]
    between = prog[j:i] if j < i else prog[i + 1:j + 1]
    return all(b.mb != a.mb and b.kind != a.kind for b in between)


def _with(schedule: Schedule, programs) -> Schedule:
    from dataclasses import replace

    return replace(schedule, programs=tuple(tuple(p) for p in programs))


def _fits(schedule: Schedule, rank: int, size, free_at_i: float, cap) -> bool:
    return peak_memory(schedule, size, free_at_i)[rank] <= cap[rank] * (1 + _EPS)
