"""Expert-parallel all-to-all beside compute: plain ops pay it in turn, F&B pairs hide what fits."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from stagewise.actions import Pair
from stagewise.costs import CostError, Costs
from stagewise.all_to_all import pair_time
from stagewise.report import result
from stagewise.schedules import FAMILIES, ScheduleArgError, generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics

A2A_KEYS = ("a2a", "exposed_a2a", "hidden_a2a", "exposed_a2a_fraction")


def _schedule(name, p, m):
    try:
        return generate(name, p, m)
    except ScheduleArgError:
        return None


def _explicit(costs: Costs, sched) -> Costs:
    """The same costs with the all-to-all folded into plain durations and each pair's time set by hand:
    an oracle that knows nothing of comm lanes (uniform costs, so one t_fb per stage is every pair's)."""
    f, b, a, ab = costs.t_f, costs.t_b, costs.a2a, costs.a2a if costs.a2a_b is None else costs.a2a_b
    i = b / 2
    has_pairs = any(type(op) is Pair for prog in sched.programs for op in prog)
    return Costs(t_f=f + a, t_b=b + ab, t_i=i + ab, t_w=b - i,
                 t_fb=pair_time(f, a, b, ab, i) if has_pairs else None)


@given(name=st.sampled_from(list(FAMILIES)), p=st.integers(1, 4), m=st.integers(1, 9),
       t_b=st.sampled_from([1.0, 2.0, 3.0]), a2a=st.sampled_from([0.0, 0.25, 1.0, 2.0]),
       a2a_b=st.sampled_from([None, 0.0, 0.5, 3.0]))
def test_all_to_all_is_compute_plus_comm_in_turn_and_pairs_hide_what_fits(name, p, m, t_b, a2a, a2a_b):
    sched = _schedule(name, p, m)
    if sched is None:
        return
    costs = Costs(t_f=1.0, t_b=t_b, a2a=a2a, a2a_b=a2a_b)
    got, want = simulate(sched, costs), simulate(sched, _explicit(costs, sched))
    for r in range(sched.ranks):
        assert got.starts[r] == pytest.approx(want.starts[r]) and got.ends[r] == pytest.approx(want.ends[r])
    mg, mw = metrics(got), metrics(want)
    assert mg.makespan == pytest.approx(mw.makespan) and mg.busy == pytest.approx(mw.busy)
    assert mg.peak_activations == mw.peak_activations
    if a2a == 0 and not a2a_b:  # no all-to-all: today's results, exactly, and no comm lane
        today = simulate(sched, Costs(t_f=1.0, t_b=t_b))
        assert got.comm is None and (got.starts, got.ends) == (today.starts, today.ends)
        assert sum(mg.a2a) == sum(mg.exposed_a2a) == 0
        base = result(sched, Costs(t_f=1.0, t_b=t_b))
        res = result(sched, costs)
        assert {k: v for k, v in res.items() if k not in A2A_KEYS} == {k: v for k, v in base.items()
                                                                       if k not in A2A_KEYS}


@pytest.mark.parametrize("name", ["dualpipe", "dualpipe-v"])
@pytest.mark.parametrize("t_f, t_b", [(1.0, 1.0), (1.0, 2.0), (0.5, 1.0), (2.0, 3.0)])
def test_all_to_all_equal_to_compute_a_pair_takes_max_compute_comm_per_half(name, t_f, t_b):
    tl = simulate(generate(name, 4, 8), Costs(t_f=t_f, t_b=t_b, a2a=t_f, a2a_b=t_b))
    pairs = [(op, s, e, r) for r in range(4) for op, s, e in tl.rows(r) if type(op) is Pair]
    assert pairs
    for op, s, e, r in pairs:
        assert e - s == pytest.approx(max(t_f, t_f) + max(t_b, t_b))  # everything hidden at 1:1
        lane = [c for c in tl.comm[r] if tl.schedule.programs[r][c.op] == op]
        assert sum(c.end - c.start for c in lane) == pytest.approx(t_f + t_b)
        assert sum(c.exposed for c in lane) == pytest.approx(0.0)
    # a plain op pays both in turn
    plain = [(op, s, e) for r in range(4) for op, s, e in tl.rows(r) if type(op) is not Pair and op.kind == "F"]
    assert all(e - s == pytest.approx(2 * t_f) for _, s, e in plain)


def test_at_1_to_1_a_backward_whose_input_part_outlasts_the_forward_shows_through():
    # B = 3F: the backward's chain, its all-to-all (3) and its input-gradient part (1.5), outlasts F + B (4)
    tl = simulate(generate("dualpipe", 4, 8), Costs(t_f=1.0, t_b=3.0, a2a=1.0, a2a_b=3.0))
    durations = {e - s for r in range(4) for op, s, e in tl.rows(r) if type(op) is Pair}
    assert durations == {4.5}


def test_a_pair_is_bound_by_the_slower_stream_or_chain():
    assert pair_time(1, 0, 2, 0, 1) == 3  # no all-to-all: the sum of the halves
    assert pair_time(1, 3, 2, 3, 1) == 6  # communication-bound
    assert pair_time(1, 2.5, 2, 0, 1) == 3.5  # the forward's own chain: compute, then its all-to-all
    assert pair_time(2, 0, 2, 2.5, 0.5) == 4  # the backward's chain (its weight part floats)
    # the ratio 1:1 and B = 2F (DeepSeek-V3's design point): all hidden; just past it, the comm stream rules
    assert pair_time(1, 1, 2, 2, 1) == 3 and pair_time(1, 1.2, 2, 2.4, 1) == pytest.approx(3.6)


# (family, a2a) -> exposed all-to-all per rank, hidden per rank at p=2, m=4, t_f=1, t_b=2 (a2a_b = a2a), worked
# out from the programs: every plain F, B, I exposes its a2a; a pair (c_f=1, c_b=2, c_i=1) takes
# max(3, 2a, 1+a, a+1): at a=0.5 it hides both halves' 2a = 1; at a=2 it lasts 4, exposes 1 and hides 3.
HAND = {
    ("1f1b", 0.5): ((4.0, 4.0), (0.0, 0.0)),  # 4 F + 4 B on each rank
    ("zb-h1", 2.0): ((16.0, 16.0), (0.0, 0.0)),  # 4 F + 4 I; the W's have none
    ("zb-v", 0.5): ((8.0, 8.0), (0.0, 0.0)),  # 8 F + 8 I
    # rank 0: 0F0 3F2 0F1 3B2 (3F3;0B0) 3B3 0I1 0W1: six plain ops with a2a, one pair
    ("dualpipe", 0.5): ((3.0, 3.0), (1.0, 1.0)),
    ("dualpipe", 2.0): ((13.0, 13.0), (3.0, 3.0)),
    # rank 0: ten plain ops with a2a and three pairs
    ("dualpipe-v", 0.5): ((5.0, 5.0), (3.0, 3.0)),
    ("dualpipe-v", 2.0): ((23.0, 23.0), (9.0, 9.0)),
}


@pytest.mark.parametrize("name, a2a", list(HAND))
def test_exposed_all_to_all_per_family_matches_the_hand_count(name, a2a):
    res = result(generate(name, 2, 4), Costs(t_f=1, t_b=2, a2a=a2a))
    exposed, hidden = HAND[name, a2a]
    assert res["exposed_a2a"] == pytest.approx(list(exposed))
    assert res["hidden_a2a"] == pytest.approx(list(hidden))
    assert res["a2a"] == pytest.approx([x + y for x, y in zip(exposed, hidden)])
    assert res["exposed_a2a_fraction"] == pytest.approx(sum(exposed) / (2 * res["makespan"]))


def test_a_plain_ops_all_to_all_follows_its_compute_and_w_has_none():
    tl = simulate(generate("zb-h1", 2, 2), Costs(t_f=1, t_b=2, a2a=0.5, a2a_b=0.25))
    for r in range(2):
        ops = tl.schedule.programs[r]
        assert {ops[c.op].kind for c in tl.comm[r]} == {"F", "I"}
        for c in tl.comm[r]:
            assert c.end == tl.ends[r][c.op] and c.exposed == pytest.approx(c.end - c.start)
            assert c.end - c.start == (0.5 if c.action.kind == "F" else 0.25)


def test_recomputation_replays_the_forwards_all_to_all():
    tl = simulate(generate("1f1b", 2, 2), Costs(a2a=0.5, recompute=True))
    back = [c for c in tl.comm[0] if c.action.kind == "B"]
    assert [c.end - c.start for c in back] == [1.0, 1.0]


def test_tfb_by_hand_and_all_to_all_do_not_mix():
    with pytest.raises(CostError, match="--tfb sets an F&B pair's duration by hand; with --a2a"):
        simulate(generate("dualpipe", 2, 4), Costs(a2a=1, t_fb=2.5))
    assert simulate(generate("dualpipe", 2, 4), Costs(t_fb=2.5)).comm is None  # still an override alone


@pytest.mark.parametrize("bad, words", [(dict(a2a=-1), "--a2a must be a finite number >= 0"),
                                        (dict(a2a=[1, 2, 3]), "--a2a has 3 per-stage values"),
                                        (dict(a2a_b=float("nan")), "--a2a-b must be a finite number")])
def test_bad_all_to_all_costs_name_the_option(bad, words):
    with pytest.raises(CostError, match=words):
        simulate(generate("1f1b", 2, 2), Costs(**bad))
