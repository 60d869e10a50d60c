"""The memory-capped policy search (keep / offload / recompute per stage) against a plain exhaustive search."""

from __future__ import annotations

from itertools import product

import pytest

from stagewise.costs import Costs, MemoryCap
from stagewise.memory_actions import place
from stagewise.plan.auto import memory_policy
from stagewise.schedules import generate
from stagewise.simulate import run


def brute_force(sched, costs, at):
    """Every policy placed and simulated; the least step that fits (ties: fewer changes, keep < offload <
    recompute)."""
    best = None
    for pol in product(("keep", "offload", "recompute"), repeat=sched.stages):
        _, mt = run(place(sched, pol, recompute_at=at, costs=costs), costs)
        if mt.within_cap:
            key = (mt.makespan, sum(p != "keep" for p in pol),
                   tuple(("keep", "offload", "recompute").index(p) for p in pol))
            best = min(best, (key, pol)) if best else (key, pol)
    return best


@pytest.mark.parametrize("fam, p, m", [("1f1b", 2, 4), ("1f1b", 3, 6), ("zb-h1", 3, 6), ("gpipe", 3, 4),
                                       ("interleaved-1f1b", 2, 4)])
@pytest.mark.parametrize("bw, at", [(1.0, "backward"), (0.5, "bubble")])
def test_the_least_step_under_a_cap_below_1f1b_peak_is_the_exhaustive_one(fam, p, m, bw, at):
    """At a cap below 1F1B's peak (p on its first rank), the search (exhaustive here, and its descent forced)
    returns the policy a plain exhaustive search finds, which gives something up."""
    sched = generate(fam, p, m, 2 if fam == "interleaved-1f1b" else None)
    costs = Costs(host_bandwidth=bw, cap=MemoryCap(values=(p - 1.0,)), free_at_i=0.5)
    want = brute_force(sched, costs, at)
    assert want is not None
    for exhaustive in (729, 0):
        got = memory_policy(sched, costs, recompute_at=at, exhaustive=exhaustive)
        assert (got.makespan, got.policy) == (want[0][0], want[1])
        assert got.exhaustive == (exhaustive > 0) and set(got.policy) - {"keep"}
        assert all(x <= p - 1.0 + 1e-9 for x in got.peaks)
        assert got.cost == got.makespan - run(sched, Costs(host_bandwidth=bw, free_at_i=0.5))[1].makespan >= 0


def test_no_policy_fits_and_a_search_without_cap():
    from stagewise.plan.errors import PlanError

    sched = generate("1f1b", 2, 4)
    assert memory_policy(sched, Costs(cap=MemoryCap(values=(0.5,)), recompute_keep=0.6)) is None
    with pytest.raises(PlanError, match="needs a cap"):
        memory_policy(sched, Costs())
