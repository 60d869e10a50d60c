"""The `auto` schedule: an order found for given per-stage costs and a memory cap per rank.

Like the Zero Bubble paper's automatic scheduler: the list scheduler of
``greedy.py`` (split backward, one stage per rank) tried with warm-up limits
from 1F1B's to ZB-H2's and beyond and two rules for filling idle time with
W's, then a local search that moves one rank's warm-up limit by one while that
helps. Every candidate, and every named one-stage family that fits the cap, is
simulated by the one simulator and scored by the objective:

- ``step``: the shared step end (makespan), what a synchronised optimizer step waits for;
- ``span``: the longest rank's own span, first start to last end (the Zero
  Bubble paper's measure: with the optimizer step validated after the fact
  ranks need not end together).

So `auto` is never worse than the best named family that fits. Not in the
family registry: it needs costs, which ``generate(name, p, m, v)`` does not take.

>>> from stagewise import Costs
>>> res = auto_schedule(4, 8, Costs(t_f=1, t_b=2), cap=[4] * 4, objective="span")
>>> res.value <= 24 + 3  # ZB-H1's span: 8 x (1 + 2) of work and (p-1)(F+B-2W) of fill
True
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ...costs import Costs, StageCosts
from ...schedule import Schedule
from ...schedules import FAMILIES, generate
from ...schedules.registry import ScheduleArgError
from ...simulate import simulate
from ...timeline import Metrics, metrics, peak_memory
from ...validate import validate
from ..errors import PlanError
from .greedy import Policy, greedy

_EPS = 1e-9
OBJECTIVES = ("step", "span")
FILLS = ("any", "gap", "budget")  #: the greedy's rules for filling a wait with a W
#: called with (candidates tried, candidates planned) as the search goes
Progress = Callable[[int, int], None]

__all__ = ["AutoResult", "CapError", "OBJECTIVES", "Policy", "auto_schedule", "checked", "greedy", "objective_of",
           "policies", "smallest_cap"]


class CapError(PlanError):
    """A memory cap no order can meet; the message names the smallest cap that works."""


@dataclass(frozen=True, kw_only=True)
class AutoResult:
    """The best order found and what it was compared with."""

    schedule: Schedule
    makespan: float
    value: float  #: the objective's value (makespan, or the longest rank span)
    objective: str  #: "step" or "span"
    source: str  #: "greedy warmup=... fill=...", "local search ...", or the family it equals
    families: dict  #: family name -> objective value (those that fit the cap)
    seconds: float = 0.0  #: time the search took


def objective_of(mt: Metrics, objective: str) -> float:
    """The makespan ("step") or the longest rank's own span ("span")."""
    if objective == "step":
        return mt.makespan
    return max(b + s for b, s in zip(mt.busy, mt.span_idle))


def smallest_cap(p: int, sc: StageCosts, unit_bytes: bool) -> list[float]:
    """What any order needs on each rank: one micro-batch's activation of its stage (1F1B with warm-up 1 fits)."""
    return list(sc.sizes(unit_bytes)[:p])


def auto_schedule(p: int, m: int, costs: Costs, cap: Sequence[float] | None = None, unit_bytes: bool = False, *,
                  objective: str = "step", time_limit: float = 20.0, progress: Progress | None = None) -> AutoResult:
    """The best of the named one-stage-per-rank families, the greedy variants and a local search around them.

    ``cap[r]``: the most activation (chunk-units, or bytes with ``unit_bytes``) rank r may hold.
    Raises ``CapError`` naming the smallest cap that works when ``cap`` is below it.
    """
    if objective not in OBJECTIVES:
        raise PlanError(f"--objective must be one of {', '.join(OBJECTIVES)}; got {objective!r}")
    t0 = time.perf_counter()
    sc = costs.resolve(p)
    size = sc.sizes(unit_bytes)
    cap = _checked_cap(p, sc, cap, unit_bytes)
    pols = policies(p, m)
    search = _Search(p, m, costs, sc, size, cap, objective, t0 + time_limit, progress, len(pols) + 2 * p)
    families = search.families()
    for pol in pols:
        if time.perf_counter() >= search.deadline and search.best is not None:
            break
        search.policy(pol)
    search.local()
    if progress is not None:
        progress(search.planned, search.planned)
    if search.best is None:
        raise CapError(f"no order keeps every rank within its memory cap {_fmt(cap)}")
    value, source, sched, mk = search.best
    sched = replace(sched, name="auto", params={"source": source})
    return AutoResult(schedule=sched, makespan=mk, value=value, objective=objective, source=source,
                      families=families, seconds=time.perf_counter() - t0)


def _checked_cap(p: int, sc: StageCosts, cap, unit_bytes: bool) -> list[float]:
    if cap is None:
        return [float("inf")] * p
    cap = [float(x) for x in cap]
    need = smallest_cap(p, sc, unit_bytes)
    short = [r for r in range(p) if not cap[r] >= need[r] * (1 - _EPS)]
    if short:
        r = short[0]
        unit = "bytes" if unit_bytes else "chunk-units"
        raise CapError(f"rank {r}'s cap of {cap[r]:.6g} {unit} is below what any order needs, one micro-batch's "
                       f"activation of its stage; the smallest cap that works is {_fmt(need)}")
    return cap


def _fmt(xs) -> str:
    vals = sorted(set(xs))
    return f"{vals[0]:.6g}" if len(vals) == 1 else ",".join(f"{x:.6g}" for x in xs)


def policies(p: int, m: int) -> list[Policy]:
    """Warm-up limits from 1F1B's (p - r) up to ZB-H2's 2(p - r) - 1 and beyond (every extra k up to 12 ranks,
    then about a dozen), each with both fill rules, holding the first gradient's path clear or not; the
    larger warm-ups first, since they are what a roomier cap is for."""
    ks = range(p + 1) if p <= 12 else sorted({round(i * p / 10) for i in range(11)} | {1, 2})
    shapes = {tuple(min(m, p - r + k) for r in range(p)) for k in ks}
    for num in (1, 2):  # extra warm-up growing towards the first stage, as in ZB-H2 (and 2(p - r))
        shapes.add(tuple(min(m, p - r + (num * (p - r - 1) + num - 1) // 2) for r in range(p)))
    return [Policy(warmup=w, fill=(f,) * p, hold=h) for w in sorted(shapes, reverse=True)
            for h in (True, False) for f in FILLS]


class _Search:
    """Candidates scored so far and the best one. Mutable: it is the search's state."""

    def __init__(self, p, m, costs, sc, size, cap, objective, deadline, progress, planned):
        self.p, self.m, self.costs, self.sc, self.size, self.cap = p, m, costs, sc, size, cap
        self.objective, self.deadline, self.progress, self.planned = objective, deadline, progress, planned
        self.best: tuple[float, str, Schedule, float] | None = None
        self.tried = 0
        self.greedy_values: list[tuple[float, int, Policy]] = []  #: the local search starts from the best

    def score(self, sched: Schedule, source: str, makespan: float | None = None, span: float | None = None
              ) -> float:
        """The objective of an order (from the greedy's own times when given, else simulated); keeps the best."""
        if makespan is None:
            mt = metrics(simulate(sched, self.costs, check=False))
            makespan, span = mt.makespan, objective_of(mt, "span")
        value = makespan if self.objective == "step" else span
        if self.best is None or (value, source) < self.best[:2]:
            self.best = (value, source, sched, makespan)
        return value

    def tick(self) -> None:
        self.tried += 1
        if self.progress is not None:
            self.progress(min(self.tried, self.planned), self.planned)

    def families(self) -> dict:
        out = {}
        for name, fam in FAMILIES.items():
            if (fam.chunks is not None and 1 not in fam.chunks) or fam.slices:  # one slice: its plain family
                continue
            try:
                sched = generate(name, self.p, self.m, 1)
            except (ScheduleArgError, ModuleNotFoundError):
                continue
            peaks = peak_memory(sched, self.size, self.sc.free_at_i)
            if sched.stages == self.p and all(x <= c * (1 + _EPS) for x, c in zip(peaks, self.cap)):
                out[name] = self.score(sched, name)
        return out

    def policy(self, pol: Policy, source: str | None = None) -> float | None:
        self.tick()
        out = greedy(self.p, self.m, self.sc, self.size, self.cap, pol)
        if out is None:
            return None
        value = self.score(out.schedule, source or f"greedy {pol.describe()}", out.makespan, out.span)
        if source is None:
            self.greedy_values.append((value, len(self.greedy_values), pol))
        return value

    def local(self) -> None:
        """Hill-climb from the best greedy policy of each kind (hold or not, fill rule), best first, until the
        deadline: the kinds end in different local optima."""
        starts: dict = {}
        for value, i, pol in sorted(self.greedy_values):
            starts.setdefault((pol.hold, pol.fill), (value, i, pol))
        for value, _, pol in sorted(starts.values()):
            if time.perf_counter() >= self.deadline:
                return
            self.climb(value, pol)

    def climb(self, current: float, pol: Policy) -> None:
        """Move one rank's warm-up limit by one, or flip its fill rule, while that helps."""
        improved = True
        while improved and time.perf_counter() < self.deadline:
            improved = False
            for r in range(self.p):
                for cand in _neighbours(pol, r, self.m):
                    if time.perf_counter() >= self.deadline:
                        break
                    value = self.policy(cand, f"local search {cand.describe()}")
                    if value is not None and value < current - _EPS * abs(current):
                        pol, current, improved = cand, value, True


def _neighbours(pol: Policy, r: int, m: int) -> list[Policy]:
    """Rank r's warm-up limit one up or down, or its other fill rule."""
    out = []
    for step in (1, -1):
        w = list(pol.warmup)
        w[r] += step
        if 1 <= w[r] <= m:
            out.append(Policy(warmup=tuple(w), fill=pol.fill, hold=pol.hold))
    for rule in FILLS:
        if rule != pol.fill[r]:
            fill = list(pol.fill)
            fill[r] = rule
            out.append(Policy(warmup=pol.warmup, fill=tuple(fill), hold=pol.hold))
    return out


def checked(result: AutoResult) -> AutoResult:
    """The result after the validator's proof that its order runs (used by tests and the CLI)."""
    validate(result.schedule)
    return result
