"""Measured timelines and the prediction from them, checked against the simulator itself.

A simulated timeline read back as if measured must give back the costs it was
simulated with, and so a predicted bubble equal to its own.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stagewise.costs import Costs
from stagewise.runtime.execution.timing import bubbles, mean_costs, measured_timeline
from stagewise.schedules import FAMILIES, generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics


def as_measured(tl):
    rows = [list(zip(s, e)) for s, e in zip(tl.starts, tl.ends)]
    return measured_timeline(tl.schedule, rows)


@given(name=st.sampled_from(sorted(FAMILIES)), p=st.sampled_from([2, 4]),
       f=st.lists(st.floats(0.5, 3), min_size=8, max_size=8), b=st.floats(1, 3))
def test_mean_costs_give_back_the_simulated_costs_and_the_same_bubble(name, p, f, b):
    sched = generate(name, p, 8)
    S = sched.stages
    t_f = f[:S]  # S <= 8 stages at p <= 4
    costs = Costs(t_f=t_f, t_b=[b * x for x in t_f], t_i=[0.4 * b * x for x in t_f],
                  t_w=[0.6 * b * x for x in t_f], t_fb=[(1 + b) * x for x in t_f])
    tl = as_measured(simulate(sched, costs))
    assert tl.source == "measured" and tl.unit == "s"
    got = mean_costs([tl])
    kinds = {a.kind for a in sched.actions()}
    for field, kind in (("t_f", "F"), ("t_b", "B"), ("t_i", "I"), ("t_w", "W")):
        if kind in kinds:
            used = {a.stage for a in sched.actions() if a.kind == kind}
            want, have = getattr(costs, field), getattr(got, field)
            assert all(have[s] == pytest.approx(want[s]) for s in used), field
    measured, predicted = bubbles([tl])
    assert measured == pytest.approx(metrics(tl).bubble_fraction)
    assert predicted == pytest.approx(measured, abs=1e-9)


def test_the_bubble_is_the_mean_over_steps():
    sched = generate("1f1b", 2, 4)
    a = as_measured(simulate(sched, Costs()))
    b = as_measured(simulate(sched, Costs(t_f=[1, 3], t_b=[2, 6])))
    measured, _ = bubbles([a, b])
    assert measured == pytest.approx((metrics(a).bubble_fraction + metrics(b).bubble_fraction) / 2)
    assert dataclasses.is_dataclass(mean_costs([a, b]))
