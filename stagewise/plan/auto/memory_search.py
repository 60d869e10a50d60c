"""Under a memory cap, what each stage does with its activations: keep, offload or recompute (PipeOffload, Mario).

``memory_policy(schedule, costs)`` places every per-stage policy it tries (``memory_actions.place``), simulates
it against ``costs`` (whose ``cap`` says the most each rank may hold, ``MemoryCap``) and returns the least
simulated step among those that fit, with what it costs over keeping everything (the schedule without a cap).
Ties go to fewer stages that give anything up, then to keep before offload before recompute, stage by stage.

How it searches: every policy while there are at most ``exhaustive`` of them (3^stages; 729 by default: six
stages), else a descent: while a rank is over its cap, set the fullest rank's stages anew, together (the
cheapest setting that brings it under, else the one that brings it lowest), then reset any rank's stages
while the step drops and every rank still fits. tests/test_memory_search.py checks both against a plain
exhaustive search on small cases.

Example:
    >>> from stagewise import Costs
    >>> from stagewise.costs import MemoryCap
    >>> from stagewise.schedules import generate
    >>> got = memory_policy(generate("1f1b", 4, 8), Costs(cap=MemoryCap(values=(3.0,)), host_bandwidth=1.0))
    >>> got.describe(), got.makespan, got.base, got.peaks  # 1F1B's first rank holds 4 without; free here
    ('offload 0', 33.0, 33.0, (3.0, 3.0, 2.0, 1.0))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from ...costs import Costs
from ...memory_actions import KEEP, POLICIES, place
from ...schedule import Schedule
from ...simulate import simulate
from ...timeline import metrics
from ..errors import PlanError


@dataclass(frozen=True, kw_only=True)
class PolicyResult:
    """The per-stage policy with the least simulated step under the cap, and its schedule."""

    schedule: Schedule  #: with its memory actions placed
    policy: tuple[str, ...]  #: per stage, one of ``memory_actions.POLICIES``
    makespan: float  #: its simulated step
    base: float  #: the step keeping everything (no memory action, no cap)
    peaks: tuple[float, ...]  #: per rank, its peak in the cap's unit
    tried: int  #: policies simulated
    exhaustive: bool  #: whether every policy was tried

    @property
    def cost(self) -> float:
        """What fitting under the cap costs in step time over keeping everything."""
        return self.makespan - self.base

    def describe(self) -> str:
        """'offload 0,1; recompute 3' (or 'keep everything')."""
        parts = [f"{p} {','.join(str(s) for s, q in enumerate(self.policy) if q == p)}" for p in POLICIES[1:]
                 if p in self.policy]
        return "; ".join(parts) or "keep everything"


def memory_policy(schedule: Schedule, costs: Costs, *, recompute_at: str = "backward",
                  exhaustive: int = 729) -> PolicyResult | None:
    """The least step that fits ``costs.cap`` over the per-stage policies (module docstring); None: none fits
    (not even recomputing or offloading every stage)."""
    if costs.cap is None:
        raise PlanError("a memory policy search needs a cap (--cap or --cap-bytes)")
    search = _Search(schedule, costs, recompute_at)
    S = schedule.stages
    if 3 ** S <= exhaustive:
        for pol in product(POLICIES, repeat=S):
            search.score(pol)
        return search.result(True)
    search.descend()
    return search.result(False)


def _rank_moves(pol: tuple[str, ...], stages) -> list[tuple[str, ...]]:
    """``pol`` with the policies of one rank's ``stages`` set every way (3^v for its v stages)."""
    out = []
    for choice in product(POLICIES, repeat=len(stages)):
        cand = list(pol)
        for s, p in zip(stages, choice):
            cand[s] = p
        out.append(tuple(cand))
    return out


def _key(value: float, pol: tuple[str, ...]) -> tuple:
    """The order of candidates: step, then fewer stages giving anything up, then keep < offload < recompute."""
    return (value, sum(p != KEEP for p in pol), tuple(POLICIES.index(p) for p in pol))


class _Search:
    """Policies simulated so far (each once) and the best that fits. Mutable: the search's state."""

    def __init__(self, schedule: Schedule, costs: Costs, recompute_at: str):
        self.schedule, self.costs, self.at = schedule, costs, recompute_at
        self.seen: dict[tuple, tuple] = {}  # policy -> (makespan, peaks, fits, schedule)
        self.best: tuple | None = None
        self.base = metrics(simulate(schedule, replace(costs, cap=None))).makespan

    def score(self, pol: tuple[str, ...]) -> tuple:
        got = self.seen.get(pol)
        if got is None:
            sched = place(self.schedule, pol, recompute_at=self.at, costs=self.costs)
            mt = metrics(simulate(sched, self.costs, check=False))
            got = self.seen[pol] = (mt.makespan, mt.peak_in_cap_unit, mt.within_cap, sched)
            if mt.within_cap and (self.best is None or _key(mt.makespan, pol) < _key(self.best[0], self.best[1])):
                self.best = (mt.makespan, pol)
        return got

    def descend(self) -> None:
        """Give up the over-cap ranks' stages one at a time, then improve while the step drops."""
        mine = [self.schedule.stages_of_rank(r) for r in range(self.schedule.ranks)]
        cap = self.costs.cap.per_rank(self.schedule.ranks)
        pol = (KEEP,) * self.schedule.stages
        while True:
            _, peaks, fits, _ = self.score(pol)
            if fits:
                break
            r = max(range(len(cap)), key=lambda q: peaks[q] / cap[q])
            moves = [c for c in _rank_moves(pol, mine[r]) if c != pol]
            lower = [c for c in moves if self.score(c)[1][r] < peaks[r]]
            if not lower:
                return  # the fullest rank cannot come down further: nothing fits this way
            enough = [c for c in lower if self.score(c)[1][r] <= cap[r] * (1 + 1e-9)]
            # the cheapest change that brings the rank under its cap, else the one that brings it lowest
            pol = min(enough, key=lambda c: _key(self.score(c)[0], c)) if enough else \
                min(lower, key=lambda c: (self.score(c)[1][r],) + _key(self.score(c)[0], c))
        improved = True
        while improved:
            improved = False
            for stages in mine:
                for cand in _rank_moves(pol, stages):
                    value, _, fits, _ = self.score(cand)
                    if fits and _key(value, cand) < _key(self.score(pol)[0], pol):
                        pol, improved = cand, True

    def result(self, exhaustive: bool) -> PolicyResult | None:
        if self.best is None:
            return None
        value, pol = self.best
        _, peaks, _, sched = self.seen[pol]
        return PolicyResult(schedule=sched, policy=pol, makespan=value, base=self.base, peaks=tuple(peaks),
                            tried=len(self.seen), exhaustive=exhaustive)
