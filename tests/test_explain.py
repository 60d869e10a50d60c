"""Why each idle gap waits: chains that follow real dependencies back to a named cause."""

import doctest
from dataclasses import replace

import pytest

from stagewise.actions import Action, Pair, actions_of, parse
from stagewise.costs import Costs
from stagewise.explain import (At, deadlock, explain, explain_at, gap_causes, gap_dict, idle_by_cause, messages)
from stagewise.schedule import make
from stagewise.schedules import FAMILIES, generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics
from stagewise.validate import ScheduleError, validate


def timeline(name, p=4, m=8, **costs):
    return simulate(generate(name, p, m), Costs(**costs))


def needs(sched, op, dep) -> bool:
    """Whether ``op`` needs ``dep``'s result (DESIGN.md's rules, written out here independently of the engine)."""
    for kind, s, mb in actions_of(op):
        lane = sched.lane_of_stage(s)
        for dk, ds, dmb in actions_of(dep):
            if dmb != mb:
                continue
            if kind == "F" and dk == "F" and ds == s - 1 and s > lane.stage_lo:
                return True
            if kind in "BI" and ((dk == "F" and ds == s) or (dk in "BI" and ds == s + 1 and s + 1 < lane.stage_hi)):
                return True
            if kind == "W" and dk == "I" and ds == s:
                return True
    return False


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("costs", [{}, {"latency": 0.25}, {"t_f": [2, 1, 1, 2, 1, 1, 1, 2]}], ids=["even", "link", "uneven"])
def test_gaps_cover_the_idle_time_and_every_chain_is_a_dependency_chain(name, costs):
    sched = generate(name, 4, 8)
    if isinstance(costs.get("t_f"), list):
        costs = {"t_f": costs["t_f"][:sched.stages] + [1] * (sched.stages - len(costs["t_f"]))}
    tl = simulate(sched, Costs(**costs))
    gaps = explain(tl)
    mt = metrics(tl)
    for r in range(sched.ranks):  # the gaps of a rank are exactly its idle time
        assert sum(g.length for g in gaps if g.rank == r) == pytest.approx(mt.idle[r])
    assert sum(idle_by_cause(gaps).values()) == pytest.approx(sum(mt.idle))
    progs = sched.programs
    for g in gaps:
        assert g.cause in ("fill", "drain", "slow stage", "link", "order")
        if g.before is None:
            assert g.cause == "drain" and g.end == pytest.approx(max(e[-1] for e in tl.ends))
            continue
        assert g.end == tl.starts[g.rank][g.before.pos] and g.chain[0].at == g.before
        for a, b in zip(g.chain, g.chain[1:]):
            assert a.waits_for == b.at  # one chain, link to link
        for step in g.chain:
            op, dep = progs[step.at.rank][step.at.pos], progs[step.waits_for.rank][step.waits_for.pos]
            assert needs(sched, op, dep), (str(op), str(dep))
            assert tl.ends[step.waits_for.rank][step.waits_for.pos] <= tl.starts[step.at.rank][step.at.pos] + 1e-9
        assert g.origin == g.chain[-1].waits_for
        if g.cause == "fill":  # the chain starts with the step
            assert g.blocker is None and tl.starts[g.origin.rank][g.origin.pos] == min(s[0] for s in tl.starts)
        else:  # the rank at the chain's end was busy with the op before until the chain could go on
            assert g.blocker == At(g.origin.rank, g.origin.pos - 1)
            assert tl.ends[g.blocker.rank][g.blocker.pos] == pytest.approx(tl.starts[g.origin.rank][g.origin.pos])


@pytest.mark.parametrize("p, m", [(4, 8), (3, 5), (6, 6)])
def test_1f1b_fill_per_rank_is_its_wait_for_the_first_micro_batch(p, m):
    # rank r waits r*t_F for micro-batch 0's forward, then (p-1-r)*t_B for its gradient; the rest of its
    # (p-1)(t_F+t_B) is the drain
    f, b = 1.0, 2.0
    gaps = explain(timeline("1f1b", p, m))
    for r in range(p):
        fill = sum(g.length for g in gaps if g.rank == r and g.cause == "fill")
        drain = sum(g.length for g in gaps if g.rank == r and g.cause == "drain")
        assert (fill, drain) == (r * f + (p - 1 - r) * b, (p - 1) * (f + b) - r * f - (p - 1 - r) * b)


def test_the_known_gap_of_1f1b_names_what_it_waits_for():
    tl = timeline("1f1b")
    gap = explain_at(tl, 0, 4)  # rank 0 after its four warm-up forwards
    assert (gap.start, gap.end, str(tl.schedule.programs[0][4])) == (4.0, 10.0, "0B0")
    prog = tl.schedule.programs
    assert [str(prog[s.waits_for.rank][s.waits_for.pos]) for s in gap.chain] == \
        ["1B0", "2B0", "3B0", "3F0", "2F0", "1F0", "0F0"]
    assert gap.cause == "fill" and gap.chain[0].what == "gradient"
    assert gap.text.startswith("rank 0 idle 4..10 (6): 0B0 waits for 1B0 (gradient from rank 1)")
    assert explain_at(tl, 0, 1) is None  # 0F1 ran right after 0F0
    done = explain_at(tl, 3, None)
    assert done.cause == "drain" and "step ends at 33" in done.text
    d = gap_dict(gap, tl)
    assert d["waits_for"] == {"op": "1B0", "rank": 1, "position": 3} and d["chain"][-1]["op"] == "0F0"


def test_each_cause_where_it_belongs():
    by = idle_by_cause(explain(timeline("gpipe")))
    assert by["fill"] == 0 + 1 + 2 + 3 and by["drain"] == 36 - 6  # GPipe: the leading forwards only
    slow = explain(timeline("1f1b", t_f=[1, 1, 1, 3], t_b=[2, 2, 2, 6]))
    assert any(g.cause == "slow stage" and "stage 3's" in g.text for g in slow)
    linked = explain(timeline("1f1b", latency=0.5))
    assert any(g.cause == "link" for g in linked) and not any(g.cause == "link" for g in explain(timeline("1f1b")))
    assert idle_by_cause(explain(timeline("zb-h1")))["drain"] == 0  # W fills the cooldown
    assert idle_by_cause(explain(timeline("interleaved-1f1b")))["order"] > 0  # a chunk's work runs before


def test_a_measured_timeline_is_explained_by_its_times_alone():
    tl = timeline("zb-v")
    measured = replace(tl, meta={}, source="measured")
    assert [(g.rank, g.cause, g.length) for g in explain(measured)] == [(g.rank, g.cause, g.length) for g in explain(tl)]


def test_gap_causes_is_explain_in_brief():
    tl = timeline("v-half", latency=0.1)
    t0 = min(s[0] for s in tl.starts)
    assert gap_causes(tl) == [(g.rank, g.start - t0, g.end - t0, g.before.pos if g.before else -1, g.cause)
                              for g in explain(tl)]


def test_messages_cross_ranks_and_arrive_a_link_later():
    tl = timeline("1f1b", p=3, m=4, latency=0.5)
    msgs = messages(tl)
    assert len(msgs) == 2 * (3 - 1) * 4  # an activation and a gradient per boundary and micro-batch
    progs = tl.schedule.programs
    for src, dst, what, arrival in msgs:
        assert src.rank != dst.rank and needs(tl.schedule, progs[dst.rank][dst.pos], progs[src.rank][src.pos])
        assert arrival == tl.ends[src.rank][src.pos] + 0.5 <= tl.starts[dst.rank][dst.pos]
        assert what == ("activation" if progs[src.rank][src.pos].kind == "F" else "gradient")
    assert not messages(simulate(generate("zb-v", 1, 2)))  # one rank: nothing crosses


def programs(text):
    return [[parse(x) for x in row.split()] for row in text.strip().splitlines()]


def test_a_deadlock_gives_its_cycle_and_what_ran_before_it():
    # rank 0 waits for 1B0 before sending 0F1; rank 1 waits for 0F1 before running 1B0
    sched = make("mine", programs("0F0 0B0 0F1 0B1\n1F0 1F1 1B0 1B1"), [0, 1], 2)
    with pytest.raises(ScheduleError) as e:
        validate(sched)
    dl = deadlock(sched, Costs())
    assert dl.message == str(e.value) and dl.closed
    assert dl.cycle == ((At(0, 1), At(1, 2)), (At(1, 1), At(0, 2)))
    assert dl.blocked == (At(0, 1), At(1, 1))
    assert [[str(op) for op in p] for p in dl.ran.schedule.programs] == [["0F0"], ["1F0"]]
    assert dl.ran.starts == ((0.0,), (1.0,)) and dl.ran.ends == ((1.0,), (2.0,))
    assert deadlock(generate("1f1b", 2, 2), Costs()) is None
    with pytest.raises(ScheduleError, match="duplicate action 0F0"):
        deadlock(make("dup", programs("0F0 0F0 0B0 0B1\n1F0 1B0 1F1 1B1"), [0, 1], 2), Costs())


def test_a_deadlock_on_one_rank_is_a_cycle_of_one():
    sched = make("mine", programs("0F0 0F1 0B0 0B1\n1B0 1F0 1F1 1B1"), [0, 1], 2)
    dl = deadlock(sched, Costs())
    assert dl.closed and dl.cycle == ((At(1, 0), At(1, 1)),) and dl.blocked == (At(0, 2), At(1, 0))
    assert dl.ran.ends[0] == (1.0, 2.0)  # rank 0's forwards ran; its 0B0 waits for rank 1


def test_pairs_wait_for_both_halves():
    tl = timeline("dualpipe-v")
    for g in explain(tl):
        for step in g.chain:
            op = tl.schedule.programs[step.at.rank][step.at.pos]
            if type(op) is Pair:
                dep = tl.schedule.programs[step.waits_for.rank][step.waits_for.pos]
                assert needs(tl.schedule, op.forward, dep) or needs(tl.schedule, op.backward, dep)
    assert Action("F", 0, 0) in {a for op in tl.schedule.programs[0] for a in actions_of(op)}


def test_the_example_in_the_docstring_runs():
    import stagewise.explain

    assert doctest.testmod(stagewise.explain).failed == 0
