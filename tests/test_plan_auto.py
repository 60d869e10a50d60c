"""The auto schedule (greedy + every family) and the proven optimum (MILP) on uneven stage costs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise import Costs, generate, metrics, simulate, validate
from stagewise.plan.auto import auto_schedule
from stagewise.plan.auto import optimum
from stagewise.timeline import peak_memory

#: the documented case: p=4, m=6, uneven stages; auto beats the best family (zb-h1, 41.8) by 7.2%
STRICT = dict(t_f=[1, 2, 2, 0.5], t_b=[1.6, 4, 4, 0.8], t_i=[1.12, 1.6, 2.8, 0.32], t_w=[0.48, 2.4, 1.2, 0.48])


def family_makespans(p, m, costs, cap=None):
    out = {}
    for name in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
        s = generate(name, p, m)
        if cap is None or all(x <= c for x, c in zip(peak_memory(s, [1.0] * p), cap)):
            out[name] = metrics(simulate(s, costs)).makespan
    return out


costs_strategy = st.integers(2, 4).flatmap(lambda p: st.tuples(
    st.just(p), st.integers(1, 8),
    st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=p, max_size=p),
    st.lists(st.sampled_from([0.3, 0.5, 0.7]), min_size=p, max_size=p),
    st.sampled_from([None, 2, 3, 4])))


@given(costs_strategy)
def test_auto_never_slower_than_the_best_family(case):
    p, m, tf, wshare, cap = case
    tb = [2 * x for x in tf]
    costs = Costs(t_f=tf, t_b=tb, t_w=[b * w for b, w in zip(tb, wshare)],
                  t_i=[b * (1 - w) for b, w in zip(tb, wshare)], latency=0.1)
    caps = None if cap is None else [cap] * p
    fams = family_makespans(p, m, costs, caps)
    try:
        res = auto_schedule(p, m, costs, caps)
    except ValueError:
        assert not fams  # only when nothing fits the cap
        return
    validate(res.schedule)
    assert res.schedule.name == "auto"
    tl = simulate(res.schedule, costs)
    assert metrics(tl).makespan == pytest.approx(res.makespan)
    if fams:
        assert res.makespan <= min(fams.values()) + 1e-9
    if caps:
        assert max(metrics(tl).peak_activations) <= cap


def test_auto_strictly_faster_on_the_documented_case():
    costs = Costs(**STRICT)
    fams = family_makespans(4, 6, costs)
    res = auto_schedule(4, 6, costs)
    assert min(fams.values()) == pytest.approx(41.8)
    assert res.makespan == pytest.approx(39.0)
    assert res.source.startswith("greedy")


def test_optimum_is_proven_and_the_floor():
    costs = Costs(**STRICT)
    res = auto_schedule(4, 6, costs)
    opt = optimum(4, 6, costs, upper=res.makespan)
    assert opt.proven and opt.makespan == pytest.approx(opt.bound, rel=1e-6)
    validate(opt.schedule)
    assert metrics(simulate(opt.schedule, costs)).makespan == pytest.approx(opt.makespan, rel=1e-6)
    assert opt.makespan <= res.makespan + 1e-9
    for v in family_makespans(4, 6, costs).values():
        assert v >= opt.makespan - 1e-9


@settings(max_examples=8)
@given(st.integers(2, 3), st.integers(2, 4), st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=3, max_size=3),
       st.sampled_from([None, 2]))
def test_optimum_never_above_auto_and_respects_the_cap(p, m, tf, cap):
    costs = Costs(t_f=tf[:p], t_b=[2 * x for x in tf[:p]], latency=0.25)
    caps = None if cap is None else [cap] * p
    res = auto_schedule(p, m, costs, caps)
    opt = optimum(p, m, costs, caps, upper=res.makespan)
    assert opt.proven
    assert opt.makespan <= res.makespan + 1e-6
    tl = simulate(opt.schedule, costs)
    assert metrics(tl).makespan == pytest.approx(opt.makespan, rel=1e-6)
    if caps:
        assert max(metrics(tl).peak_activations) <= cap


def test_optimum_refuses_large_cases():
    from stagewise.plan.errors import PlanError

    with pytest.raises(PlanError, match="p <= 4 and m <= 8"):
        optimum(5, 8, Costs())
