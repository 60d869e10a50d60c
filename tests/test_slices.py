"""Sequence slices (Seq1F1B): the generators, the slice rules in the validator and the engine, the memory model,
the closed forms at k slices, and the CLI's --slices."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import fails, raises_said, run
from hypothesis import given
from hypothesis import strategies as st
from test_schedules import check_timeline

from stagewise.actions import Action
from stagewise.costs import CostError, Costs, slice_activation
from stagewise.engine import Stuck, play
from stagewise.formulas import idle_per_rank
from stagewise.schedule import make
from stagewise.schedules import FAMILIES, ScheduleArgError, generate
from stagewise.simulate import simulate
from stagewise.timeline import metrics
from stagewise.validate import ScheduleError, describe_deadlock, validate

SLICED = [n for n, f in FAMILIES.items() if f.slices]
_said = re.escape  # raises_said reads a pattern
times = st.sampled_from([0.5, 1.0, 2.0, 3.0])


def check_slice_order(tl) -> None:
    """On every stage: slice j's forward after slice j-1's, slice j's backward after slice j+1's."""
    k, when = tl.schedule.slices, {}
    for r in range(tl.ranks):
        for op, start, end in tl.rows(r):
            when[tuple(op)] = (start, end)
    for (kind, s, u), (start, _) in when.items():
        if kind == "F" and u % k:
            assert start >= when[("F", s, u - 1)][1] - 1e-9, (kind, s, u)
        if kind in "BI" and u % k < k - 1:
            assert start >= when[(kind, s, u + 1)][1] - 1e-9, (kind, s, u)


@given(st.sampled_from(SLICED), st.integers(1, 8), st.integers(1, 8), st.integers(1, 5), times, times,
       st.sampled_from([0.0, 0.5]))
def test_every_sliced_schedule_validates_and_plays_each_unit_after_its_slices(name, p, m, k, f, b, latency):
    sched = validate(generate(name, p, m, slices=k))
    assert (sched.slices, sched.microbatches) == (k, m * k)
    tl = simulate(sched, Costs(t_f=f, t_b=b, latency=latency))  # the engine never gets stuck
    check_timeline(tl, latency)
    check_slice_order(tl)


@pytest.mark.parametrize("name, plain", [("seq1f1b", "1f1b"), ("seq1f1b-zb", "zb-h1")])
def test_one_slice_is_the_family_without_slices_exactly(name, plain):
    for p in range(1, 7):
        for m in range(1, 13):
            assert generate(name, p, m, slices=1).programs == generate(plain, p, m).programs, (p, m)


def test_seq1f1b_warms_up_in_slices_and_runs_backwards_last_slice_first():
    sched = generate("seq1f1b", 2, 2, slices=2)
    assert str(sched) == ("rank 0: 0F0 0F1 0F2 0B1 0F3 0B0 0B3 0B2\n"
                          "rank 1: 1F0 1F1 1B1 1F2 1B0 1F3 1B3 1B2")


@given(st.sampled_from(SLICED), st.integers(1, 8), st.integers(1, 8), st.integers(1, 5), times, times)
def test_the_closed_forms_hold_in_a_slice_s_costs(name, p, m, k, f, b):
    """1F1B's (p-1)(F+B) and ZB-H1's (p-1)(F+B-2W) in the costs of one slice (1/k of a micro-batch's), and the
    first rank's peak (p + k - 1)/k micro-batches."""
    costs = Costs(t_f=f, t_b=b, t_i=b / 2, t_w=b / 2)
    mt = metrics(simulate(generate(name, p, m, slices=k), costs))
    idle = idle_per_rank(name, p, m, 1, costs, k)
    if idle is not None:
        assert max(mt.idle) == pytest.approx(idle)
    assert max(mt.peak_activations) == pytest.approx(FAMILIES[name].memory(p, m, 1, k))


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("k", [2, 4])
def test_slices_cut_the_peak_toward_one_kth_of_1f1b_s_and_the_bubble_by_k(p, k):
    """The paper's claims as derived properties: the same micro-batches, cut in k, hold (p + k - 1)/(k p) of
    1F1B's peak (half at k = 2 as p grows) and idle 1/k as long."""
    m = 2 * p
    one = metrics(simulate(generate("1f1b", p, m)))
    cut = metrics(simulate(generate("seq1f1b", p, m, slices=k)))
    ratio = max(cut.peak_activations) / max(one.peak_activations)
    assert ratio == pytest.approx((p + k - 1) / (k * p))
    assert 1 / k < ratio <= 1 / k + (k - 1) / (k * p)
    assert max(cut.idle) == pytest.approx(max(one.idle) / k)
    assert sum(cut.busy) == pytest.approx(sum(one.busy))  # the same work, cut in k


def test_a_slice_keeps_its_share_and_the_keys_and_values_it_attends_to():
    assert [slice_activation(8.0, j, 4, 0.5) for j in range(4)] == [2.0, 3.0, 4.0, 5.0]
    assert slice_activation(8.0, 0, 1, 0.5) == 8.0  # one slice: the micro-batch
    # the peak grows by what the later slices keep twice, and at k = 1 the keys and values change nothing
    kv = Costs(kv_share=0.5)
    assert metrics(simulate(generate("1f1b", 4, 8), kv)).peak_activations == (4.0, 3.0, 2.0, 1.0)
    plain, with_kv = (max(metrics(simulate(generate("seq1f1b", 4, 8, slices=2), c)).peak_activations)
                      for c in (Costs(), kv))
    # rank 0 holds 5 slices at its peak: micro-batch 0's two, 1's two, 2's first; slices 1 keep 1/2 x 1/2 more
    assert (plain, with_kv) == (2.5, 2.5 + 2 * 0.5 * 0.5)
    with raises_said(CostError, _said("--kv-share must be between 0 and 1; got 2")):
        Costs(kv_share=2).resolve(4, 2)


def test_a_hand_made_program_out_of_slice_order_is_refused_naming_both_actions():
    A = Action
    forward = make("hand", [[A("F", 0, 1), A("F", 0, 0), A("B", 0, 1), A("B", 0, 0)]], [0], 2, slices=2)
    with raises_said(ScheduleError, _said("rank 0 position 0 (0F1): slice 1 of micro-batch 0 runs 0F1 before 0F0 "
                                          "(position 1): its forward attends to the keys and values of slice 0's")):
        validate(forward)
    backward = make("hand", [[A("F", 0, 0), A("F", 0, 1), A("I", 0, 0), A("I", 0, 1), A("W", 0, 0),
                              A("W", 0, 1)]], [0], 2, slices=2)
    with raises_said(ScheduleError, _said("runs 0I0 before 0I1 (position 3): its backward needs the gradient of its "
                                          "keys and values from slice 1's")):
        validate(backward)
    # the engine, handed the program without the check, is stuck on it and says the cycle and why
    for sched, why in ((forward, "waits for 0F0 at rank 0 position 1 (slice 0's forward: the keys and values "
                                 "slice 1 attends to); back to rank 0"),
                       (backward, "waits for 0I1 at rank 0 position 3 (slice 1's backward: the gradient of slice "
                                  "0's keys and values); back to rank 0")):
        with pytest.raises(Stuck) as stuck:
            play(sched, Costs().resolve(1, 2))
        assert describe_deadlock(sched, stuck.value).startswith("deadlock: wait cycle: rank 0 position ")
        assert describe_deadlock(sched, stuck.value).endswith(why)


def test_a_cross_rank_cycle_of_sliced_programs_is_named():
    """In slice order on each rank (so no slice waits), but rank 1 wants micro-batch 1's first slice before it
    hands micro-batch 0's gradients back, which rank 0 needs first: the validator names the cycle."""
    r0 = [Action(k, 0, u) for k, u in (("F", 0), ("F", 1), ("B", 1), ("B", 0), ("F", 2), ("F", 3), ("B", 3), ("B", 2))]
    r1 = [Action(k, 1, u) for k, u in (("F", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 0), ("F", 3), ("B", 3), ("B", 2))]
    with raises_said(ScheduleError, _said("deadlock: wait cycle: rank 0 position 2 (0B1) waits for 1B1 at rank 1 "
                                          "position 3; rank 1 position 2 (1F2) waits for 0F2 at rank 0 position 4; "
                                          "back to rank 0")):
        validate(make("hand", [r0, r1], [0, 1], 4, slices=2))


def test_units_must_be_whole_micro_batches():
    sched = make("hand", [[Action("F", 0, u) for u in range(3)] + [Action("B", 0, u) for u in (2, 1, 0)]],
                 [0], 3, slices=2)
    with raises_said(ScheduleError, _said("units 0..2 of stages 0..0 are not whole micro-batches of 2 slices")):
        validate(sched)


def test_slices_are_refused_where_a_family_has_none():
    with raises_said(ScheduleArgError, _said("1f1b does not cut micro-batches into sequence slices: --slices 1 only; "
                                             "got 2 (families with slices: seq1f1b, seq1f1b-zb)")):
        generate("1f1b", 4, 8, slices=2)
    with raises_said(ScheduleArgError, _said("--slices must be >= 1; got 0")):
        generate("seq1f1b", 4, 8, slices=0)


def test_the_cli_takes_slices(capsys):
    rc, out, _ = run(capsys, "simulate", "seq1f1b", "-p", "4", "-m", "8", "--slices", "2", "--json")
    res = json.loads(out)
    res = res[0] if isinstance(res, list) else res
    assert rc == 0 and (res["microbatches"], res["slices"], res["makespan"]) == (8, 2, 28.5)
    assert res["peak_activations"] == [2.5, 2.0, 1.5, 1.0]
    assert "gpipe does not cut micro-batches into sequence slices: --slices 1 only" in fails(
        capsys, "simulate", "gpipe", "--slices", "2")


# --- what reads a sliced timeline: explain, pictures ----------------------------------------------

def test_explain_says_why_a_slice_waits_and_every_gap_adds_up():
    from stagewise.causes import plain
    from stagewise.explain import explain, idle_by_cause
    from stagewise.timeline import Timeline

    tl = simulate(generate("seq1f1b", 4, 2, slices=2))
    gaps = explain(tl)
    assert sum(idle_by_cause(gaps).values()) == pytest.approx(sum(metrics(tl).idle))
    first = gaps[0]
    assert first.text.startswith("rank 0 idle 2..5.5 (3.5): 0B1 waits for 1B1 (gradient from rank 1) <- ")
    assert "<- 0F1 <- 0F0 (slice 1 waits for slice 0's forward on this stage: its keys and values)" in first.text
    assert plain(first, tl).startswith("rank 0 waits for micro-batch 0 slice 1's gradient")
    # a measured slice that started late, its keys and values long there: the sentence names the slice rule
    sched = generate("seq1f1b", 1, 1, slices=2)
    late = Timeline(schedule=sched, starts=((0.0, 2.0, 3.0, 4.0),), ends=((1.0, 3.0, 4.0, 5.0),), source="measured")
    gap = explain(late)[0]
    assert plain(gap, late) == ("rank 0: slice 1 of micro-batch 0 waits for slice 0's forward on this stage: its "
                                "keys and values")
    assert "0F1 waits for 0F0 (slice 1 waits for slice 0's forward on this stage: its keys and values)" in gap.text


def test_pictures_label_each_cell_micro_batch_dot_slice():
    from stagewise.render.ascii import draw_text
    from stagewise.render.svg import timeline_svg

    tl = simulate(generate("seq1f1b", 2, 2, slices=2))
    svg = timeline_svg(tl)
    assert ">1.1</text>" in svg and "1F3 stage 1 mb 1 slice 1 " in svg
    assert "seq1f1b · p=2 m=2 k=2 slices v=1" in svg
    assert "F1.1" in draw_text(tl, width=160, color=False)
