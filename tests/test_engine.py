"""The play engine and simulator against hand-computed timelines and a brute-force oracle."""

import random

import pytest
from hypothesis import given, strategies as st

from stagewise.actions import Action, Pair
from stagewise.costs import CostError, Costs
from stagewise.schedule import make
from stagewise.schedules import generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics
from stagewise.validate import ScheduleError


def A(text):
    from stagewise.actions import parse

    return parse(text)


def test_latency_and_bandwidth_add_to_each_crossing():
    sched = make("t", [[A("0F0"), A("0B0")], [A("1F0"), A("1B0")]], [0, 1], 1)
    # message = latency + bytes / bandwidth = 0.5 + 100 / 50
    tl = simulate(sched, Costs(t_f=1, t_b=2, latency=0.5, bandwidth=50, boundary_bytes=100))
    assert tl.starts[1][0] == pytest.approx(1 + 2.5)
    assert tl.starts[0][1] == pytest.approx(1 + 2.5 + 1 + 2 + 2.5)
    assert metrics(tl).makespan == pytest.approx(11.0)


def test_same_rank_boundary_is_free():
    sched = make("t", [[A("0F0"), A("1F0"), A("1B0"), A("0B0")]], [0, 0], 1)
    tl = simulate(sched, Costs(latency=5))
    assert tl.ends[0][-1] == pytest.approx(6.0)


def test_slowest_stage_sets_the_pace():
    # gpipe p=2 m=2, stage 1 three times slower: worked out by hand
    tl = simulate(generate("gpipe", 2, 2), Costs(t_f=[1, 3], t_b=[2, 6]))
    assert list(tl.starts[1]) == [1, 4, 7, 13]
    assert list(tl.starts[0]) == [0, 1, 13, 19]
    assert metrics(tl).makespan == 21


def test_sends_are_asynchronous():
    # rank 0 runs on after sending: its second forward starts right after its first
    tl = simulate(generate("gpipe", 2, 2), Costs(latency=10))
    assert tl.starts[0][1] == 1.0


def test_pair_costs_tfb_and_waits_for_both_inputs():
    sched = make("t", [[A("0F0"), A("0F1"), Pair(A("0F2"), A("0B0")), A("0B1"), A("0B2")]], [0], 3)
    tl = simulate(sched, Costs(t_f=1, t_b=2, t_fb=2.5))
    assert tl.ends[0][2] - tl.starts[0][2] == 2.5
    assert metrics(tl).makespan == pytest.approx(2 + 2.5 + 4)


def test_memory_peaks_and_bytes():
    tl = simulate(generate("gpipe", 2, 3), Costs(activation_bytes=[10, 20]))
    mt = metrics(tl)
    assert mt.peak_activations == (3, 3)
    assert mt.peak_activation_bytes == (30, 60)
    curve = tl.memory_curve(0)
    assert max(level for _, level in curve) == 3 and curve[-1][1] == 0


def test_split_backward_frees_at_w_unless_told():
    prog = [A("0F0"), A("0F1"), A("0I0"), A("0I1"), A("0W0"), A("0W1")]
    sched = make("t", [prog], [0], 2)
    assert metrics(simulate(sched)).peak_activations == (2,)
    tl = simulate(sched, Costs(free_at_i=0.5))
    levels = [lvl for _, lvl in tl.memory_curve(0)]
    assert levels == [0, 1, 2, 1.5, 1, 0.5, 0]


def test_recompute_costs_a_forward_and_keeps_little():
    tl = simulate(generate("1f1b", 2, 4), Costs(recompute=True, recompute_keep=0.25))
    mt = metrics(tl)
    assert mt.peak_activations == (0.5, 0.25)
    ops = dict(zip(map(str, tl.schedule.programs[1]), zip(tl.starts[1], tl.ends[1])))
    start, end = ops["1B0"]
    assert end - start == 3.0  # t_b + t_f


@pytest.mark.parametrize("bad, option", [
    (dict(t_f=-1), "--tf"), (dict(t_b=[1, 2, 3]), "--tb"), (dict(latency=-0.1), "--latency"),
    (dict(bandwidth=0), "--bandwidth"), (dict(t_w=float("nan")), "--tw"),
])
def test_bad_costs_name_the_option(bad, option):
    with pytest.raises(CostError, match=option):
        simulate(generate("1f1b", 2, 2), Costs(**bad))


def test_deadlock_is_reported_not_hung():
    # rank 0 waits for 1's gradient before sending its forward
    sched = make("t", [[A("0F0"), A("0F1"), A("0B0"), A("0B1")], [A("1F0"), A("1B0"), A("1F1"), A("1B1")]], [0, 1], 2)
    simulate(sched)  # this one is fine
    bad = make("t", [[A("0F0"), A("0B0"), A("0F1"), A("0B1")], [A("1F1"), A("1F0"), A("1B0"), A("1B1")]], [0, 1], 2)
    with pytest.raises(ScheduleError) as err:
        simulate(bad)
    assert str(err.value) == ("deadlock: wait cycle: rank 0 position 1 (0B0) waits for 1B0 at rank 1 position 2; "
                              "rank 1 position 0 (1F1) waits for 0F1 at rank 0 position 2; back to rank 0")


# -- brute-force oracle: random valid schedules, times from a global topological order ---------------

def _random_schedule(rng: random.Random, ranks: int, stages: int, m: int, split: bool):
    placement = [rng.randrange(ranks) for _ in range(stages)]
    placement[: min(ranks, stages)] = list(range(min(ranks, stages)))
    done, order = set(), []
    pending = [Action("F", 0, mb) for mb in range(m)]
    while pending:
        a = pending.pop(rng.randrange(len(pending)))
        order.append(a)
        done.add(a)
        kind, s, mb = a
        if kind == "F":
            pending.append(Action("F", s + 1, mb) if s + 1 < stages else Action("I" if split else "B", s, mb))
        elif kind in "BI":
            if split:
                pending.append(Action("W", s, mb))
            if s > 0:
                pending.append(Action("I" if split else "B", s - 1, mb))
    programs = [[a for a in order if placement[a.stage] == r] for r in range(ranks)]
    return make("random", programs, placement, m), order


def _oracle(order, placement, costs):
    sc = costs.resolve(len(placement))
    end, clock, times = {}, {}, {}
    for a in order:
        kind, s, mb = a
        r = placement[s]
        deps = []
        if kind == "F" and s > 0:
            deps.append(end[("F", s - 1, mb)] + (sc.message[s - 1] if placement[s - 1] != r else 0))
        if kind in "BI":
            deps.append(end[("F", s, mb)])
            if s + 1 < len(placement):
                g = end.get(("B", s + 1, mb), end.get(("I", s + 1, mb)))
                deps.append(g + (sc.message[s] if placement[s + 1] != r else 0))
        if kind == "W":
            deps.append(end[("I", s, mb)])
        start = max([clock.get(r, 0.0)] + deps)
        end[tuple(a)] = start + sc.duration(kind, s)
        clock[r] = end[tuple(a)]
        times[tuple(a)] = (start, end[tuple(a)])
    return times


@given(seed=st.integers(0, 10**6), ranks=st.integers(1, 4), extra=st.integers(0, 4), m=st.integers(1, 6),
       split=st.booleans(), latency=st.sampled_from([0.0, 0.3]))
def test_engine_matches_brute_force_oracle(seed, ranks, extra, m, split, latency):
    rng = random.Random(seed)
    stages = ranks + extra
    sched, order = _random_schedule(rng, ranks, stages, m, split)
    costs = Costs(t_f=[rng.choice([1, 2, 3]) for _ in range(stages)], t_b=2.0, latency=latency, boundary_bytes=0)
    tl = simulate(sched, costs)
    expect = _oracle(order, sched.placement, costs)
    for r in range(ranks):
        for op, start, end in tl.rows(r):
            assert (start, end) == pytest.approx(expect[tuple(op)])


def test_span_idle_counts_only_inside_each_ranks_span():
    h1 = metrics(simulate(generate("zb-h1", 4, 8)))
    h2 = metrics(simulate(generate("zb-h2", 4, 8)))
    assert h2.span_idle == (0, 0, 0, 0)
    assert max(h1.span_idle) > 0
    one = metrics(simulate(generate("1f1b", 4, 8)))
    # rank 0 spans the whole step, so its span idle is its idle: (p-1)(t_f+t_b)
    assert one.span_idle[0] == one.idle[0] == pytest.approx(3 * 3)
