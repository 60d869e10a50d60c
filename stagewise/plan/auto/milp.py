"""A proven optimum for small cases: the fastest F/I/W order as a mixed-integer program (HiGHS).

One stage per rank, split backward. Start times are continuous; each pair of
actions on a rank that no dependency already orders gets a binary (which runs
first) with big-M disjunctions. Dependencies and link times are the engine's (engine.py).
The optimum is over orders that run each stage's forwards, input-gradient and
weight-gradient backwards in micro-batch order (every named family does; the
micro-batches are identical, so this only removes relabelled copies). A memory
cap bounds the live activations at every forward: the ones started, less what
the input- and weight-gradients finished before it freed (``free_at_i`` of an
activation at I, the rest at W). The objective is the shared step end
(``step``) or the longest rank's own span (``span``, the Zero Bubble paper's).

Small means p <= 4 and m <= 8 (~300 binaries); larger cases are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...actions import Action
from ...costs import Costs
from ...schedule import Schedule, make
from ..errors import PlanError
from ..highs import highspy_module, linear, quiet_highs

LIMIT_P, LIMIT_M = 4, 8


@dataclass(frozen=True, kw_only=True)
class Optimum:
    """The best order found; ``proven`` when HiGHS closed the gap."""

    schedule: Schedule
    makespan: float
    bound: float  #: lower bound on any order's makespan (equals makespan when proven)
    proven: bool
    seconds: float


def optimum(p: int, m: int, costs: Costs, cap: Sequence[float] | None = None, *, time_limit: float = 60.0,
            upper: float | None = None, objective: str = "step", unit_bytes: bool = False) -> Optimum:
    """Minimum makespan (or longest rank span) over orders of F, I, W (stage r on rank r); ``cap[r]``: the most
    activation rank r may hold (chunk-units, or bytes with ``unit_bytes``).

    ``upper``: a known value of the objective (from a heuristic) that bounds the search.
    """
    if p > LIMIT_P or m > LIMIT_M:
        raise PlanError(f"the proven optimum is for p <= {LIMIT_P} and m <= {LIMIT_M}; got p={p}, m={m}")
    highspy = highspy_module("the optimal order (--auto optimum)")
    sc = costs.resolve(p)
    dur = {"F": sc.f, "I": sc.i, "W": sc.w}
    hs = quiet_highs(highspy)
    hs.setOptionValue("time_limit", float(time_limit))
    hs.setOptionValue("mip_rel_gap", 1e-6)
    loose = sum((sc.f[r] + sc.i[r] + sc.w[r]) * m for r in range(p)) + 2 * m * sum(sc.message)
    horizon = loose if upper is None else upper if objective == "step" else upper + m * (sum(sc.f) + sum(sc.message))
    start = {(k, r, j): hs.addVariable(lb=0.0, ub=horizon) for k in "FIW" for r in range(p) for j in range(m)}

    def end(a):
        return start[a] + dur[a[0]][a[1]]

    C = hs.addVariable(lb=0.0, ub=horizon)
    for r in range(p):
        if objective == "span":  # each rank's last action is its last W, its first its first F
            hs.addConstr(C >= end(("W", r, m - 1)) - start["F", r, 0])
        for j in range(m):
            if r > 0:
                hs.addConstr(start["F", r, j] >= end(("F", r - 1, j)) + sc.message[r - 1])
            hs.addConstr(start["I", r, j] >= end(("F", r, j)))
            if r < p - 1:
                hs.addConstr(start["I", r, j] >= end(("I", r + 1, j)) + sc.message[r])
            hs.addConstr(start["W", r, j] >= end(("I", r, j)))
            if j > 0:  # micro-batch order within each kind
                for k in "FIW":
                    hs.addConstr(start[k, r, j] >= end((k, r, j - 1)))
            if objective == "step":
                hs.addConstr(C >= end(("W", r, j)))
        # a rank does all its work after its first forward starts: the bound that makes the LP tight
        work = m * (sc.f[r] + sc.i[r] + sc.w[r])
        hs.addConstr(C >= (0.0 if objective == "span" else start["F", r, 0]) + work)
    before = _disjunctions(hs, start, end, p, m, horizon)
    if cap is not None:
        _memory(hs, before, p, m, sc.sizes(unit_bytes), sc.free_at_i, cap)
    hs.minimize(C)
    info = hs.getInfo()
    status = hs.getModelStatus()
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit) or \
            info.primal_solution_status != 2:
        raise PlanError(f"no order keeps every rank within the memory cap {list(cap or [])}" if cap else
                        f"the optimum search found no order ({status})")
    sched = _order(start, hs, p, m)
    return Optimum(schedule=sched, makespan=hs.val(C), bound=info.mip_dual_bound,
                   proven=status == highspy.HighsModelStatus.kOptimal, seconds=hs.getRunTime())


def _memory(hs, before, p: int, m: int, size, free_at_i: float, cap) -> None:
    """Live activation at each F(j) within the cap: j + 1 forwards, less what the I's and W's before it freed."""
    if free_at_i < 0:
        raise PlanError(f"the proven optimum models free_at_i >= 0; got {free_at_i:g}")
    for r in range(p):
        a = size[r]
        if cap[r] < a * (1 - 1e-9):
            raise PlanError(f"a memory cap of {cap[r]:g} leaves no room for one forward ({a:g})")
        for j in range(m):
            excess = (j + 1) * a - cap[r]
            if excess <= 1e-9 * a:
                continue
            freed = linear([a * free_at_i * before[("I", r, k), ("F", r, j)] for k in range(j)] +
                         [a * (1 - free_at_i) * before[("W", r, k), ("F", r, j)] for k in range(j)])
            hs.addConstr(freed >= excess)


def _disjunctions(hs, start, end, p: int, m: int, M: float) -> dict:
    """A binary for every pair of actions of one rank not ordered by a dependency chain."""
    before = {}
    for r in range(p):
        for a_kind, b_kind in (("F", "I"), ("F", "W"), ("I", "W")):
            for j in range(m):
                for k in range(j):  # b of an earlier micro-batch vs a of a later one
                    a, b = (a_kind, r, j), (b_kind, r, k)
                    x = hs.addBinary()  # 1: b before a
                    hs.addConstr(start[a] >= end(b) - M * (1 - x))
                    hs.addConstr(start[b] >= end(a) - M * x)
                    before[b, a] = x
                for k in range(j, m):  # a(j) precedes b(k >= j) through the chains: fixed
                    before[(b_kind, r, k), (a_kind, r, j)] = 0.0
    return before


def _order(start, hs, p: int, m: int) -> Schedule:
    programs = []
    for r in range(p):
        acts = [(hs.val(start[k, r, j]), "FIW".index(k), Action(k, r, j)) for k in "FIW" for j in range(m)]
        programs.append([a for *_, a in sorted(acts)])
    return make("optimum", programs, range(p), m)
