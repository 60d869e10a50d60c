"""The `auto` schedule: an order found for given per-stage costs and a memory cap.

Like the Zero Bubble paper's automatic scheduler: a greedy list schedule with
split backward, one stage per rank. Each rank, whenever it is free, runs the
input-gradient ``I`` that is ready (it unblocks the rank before), else the
forward that is ready (within the warm-up limit and the memory cap), else a
pending weight-gradient ``W`` to fill what would be idle time. Several
warm-up limits and two filling rules are tried; every candidate, and every
named family that fits the cap, is simulated by the one simulator, and the
fastest is returned. So `auto` is never slower than the best named family; on
uneven stages the greedy is often strictly faster (see tests/test_plan_auto.py).

Not in the family registry: it needs costs, which ``generate(name, p, m, v)``
does not take.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ..actions import Action
from ..costs import Costs, StageCosts
from ..schedule import Schedule, make
from ..schedules import FAMILIES, generate
from ..schedules.registry import ScheduleArgError
from ..simulate import simulate
from ..timeline import metrics, peak_memory
from ..validate import validate

_EPS = 1e-9


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One greedy variant."""

    warmup: tuple[int, ...]  #: per rank: most forwards ahead of its input-gradient backwards
    fill: str  #: "any": a W whenever nothing else is ready; "gap": only if it ends before the next ready F/I


@dataclass(frozen=True, kw_only=True)
class AutoResult:
    """The fastest order found and what it was compared with."""

    schedule: Schedule
    makespan: float
    source: str  #: "greedy warmup=... fill=..." or the family it equals
    families: dict  #: family name -> makespan (those that fit the cap)


def auto_schedule(p: int, m: int, costs: Costs, cap: Sequence[float] | None = None,
                  unit_bytes: bool = False) -> AutoResult:
    """The fastest of the greedy variants and the named one-stage-per-rank families.

    ``cap[r]``: the most activation (chunk-units, or bytes with ``unit_bytes``) rank r may hold.
    """
    sc = costs.resolve(p)
    size = sc.activation_bytes if unit_bytes and sc.activation_bytes else sc.activation
    cap = list(cap) if cap is not None else [float("inf")] * p
    found: list[tuple[float, str, Schedule]] = []
    families = {}
    for name, fam in FAMILIES.items():
        if fam.chunks is not None and 1 not in fam.chunks:
            continue
        try:
            sched = generate(name, p, m, 1)
        except (ScheduleArgError, ModuleNotFoundError):
            continue
        if sched.stages != p or not _fits(sched, size, sc.free_at_i, cap):
            continue
        families[name] = _makespan(sched, costs)
        found.append((families[name], name, sched))
    for pol in policies(p, m):
        sched = greedy(p, m, sc, size, cap, pol)
        if sched is not None:
            found.append((_makespan(sched, costs), f"greedy warmup={list(pol.warmup)} fill={pol.fill}", sched))
    if not found:
        raise ValueError(f"no order keeps every rank within its memory cap {cap}")
    best = min(found, key=lambda x: (x[0], x[1]))
    sched = replace(best[2], name="auto", params={"source": best[1]})
    return AutoResult(schedule=sched, makespan=best[0], source=best[1], families=families)


def policies(p: int, m: int) -> list[Policy]:
    """Warm-up limits from 1F1B's (p - r) up to ZB-H2's 2(p - r) - 1 and beyond, each with both fill rules."""
    shapes = set()
    for k in range(p + 1):
        shapes.add(tuple(min(m, p - r + k) for r in range(p)))
    for num in (1, 2):  # extra warm-up growing towards the first stage, as in ZB-H2
        shapes.add(tuple(min(m, p - r + (num * (p - r - 1)) // 2) for r in range(p)))
    return [Policy(warmup=w, fill=f) for w in sorted(shapes) for f in ("any", "gap")]


def greedy(p: int, m: int, sc: StageCosts, size: Sequence[float], cap: Sequence[float], pol: Policy):
    """List-schedule F, I, W on p ranks (stage r on rank r): repeatedly start the action that
    can start earliest anywhere. None if the memory cap blocks every rank."""
    INF = float("inf")
    st = _State(p, m)

    def candidate(r: int):
        """(start, kind) of what rank r would run next; None if nothing is known to be ready."""
        t = st.clock[r]
        f_ok = st.nf[r] - st.ni[r] < pol.warmup[r] and st.live[r] + size[r] <= cap[r] * (1 + _EPS)
        tf = max(t, st.f_ready(r, sc)) if f_ok else INF
        ti = max(t, st.i_ready(r, sc))
        nxt = min(ti, tf)
        if st.pending[r] and nxt > t and (pol.fill == "any" or t + sc.w[r] <= nxt + _EPS):
            return t, "W"  # fill what would be idle time
        if nxt == INF:
            return (t, "W") if st.pending[r] else None
        return (ti, "I") if ti <= tf else (tf, "F")

    for _ in range(3 * p * m):
        options = [(c, r) for r in range(p) if st.done[r] < 3 * m and (c := candidate(r)) is not None]
        if not options:
            return None  # the cap leaves no rank anything to run
        (start, kind), r = min(options)
        st.run(r, kind, start, sc, size)
    return make("auto", st.programs, range(p), m)


class _State:
    """The greedy's progress. Mutable: it is the schedule being built."""

    def __init__(self, p: int, m: int):
        INF = float("inf")
        self.p, self.m = p, m
        self.f_done = [[INF] * m for _ in range(p)]
        self.i_done = [[INF] * m for _ in range(p)]
        self.nf, self.ni, self.done = [0] * p, [0] * p, [0] * p
        self.pending: list[list[int]] = [[] for _ in range(p)]
        self.clock, self.live = [0.0] * p, [0.0] * p
        self.programs: list[list[Action]] = [[] for _ in range(p)]

    def f_ready(self, r: int, sc: StageCosts) -> float:
        if self.nf[r] >= self.m:
            return float("inf")
        return 0.0 if r == 0 else self.f_done[r - 1][self.nf[r]] + sc.message[r - 1]

    def i_ready(self, r: int, sc: StageCosts) -> float:
        j = self.ni[r]
        if j >= self.nf[r]:
            return float("inf")
        if r == self.p - 1:
            return self.f_done[r][j]
        return max(self.f_done[r][j], self.i_done[r + 1][j] + sc.message[r])

    def run(self, r: int, kind: str, start: float, sc: StageCosts, size) -> None:
        if kind == "F":
            j = self.nf[r]
            self.nf[r] += 1
            end = self.f_done[r][j] = start + sc.f[r]
            self.live[r] += size[r]
        elif kind == "I":
            j = self.ni[r]
            self.ni[r] += 1
            end = self.i_done[r][j] = start + sc.i[r]
            self.pending[r].append(j)
            self.live[r] -= size[r] * sc.free_at_i
        else:
            j = self.pending[r].pop(0)
            end = start + sc.w[r]
            self.live[r] -= size[r] * (1 - sc.free_at_i)
        self.programs[r].append(Action(kind, r, j))
        self.clock[r] = end
        self.done[r] += 1


def _fits(sched: Schedule, size, free_at_i: float, cap) -> bool:
    return all(x <= c * (1 + _EPS) for x, c in zip(peak_memory(sched, size, free_at_i), cap))


def _makespan(sched: Schedule, costs: Costs) -> float:
    return metrics(simulate(sched, costs, check=False)).makespan


def checked(result: AutoResult) -> AutoResult:
    """The result after the validator's proof that its order runs (used by tests and the CLI)."""
    validate(result.schedule)
    return result
