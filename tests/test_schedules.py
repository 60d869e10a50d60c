"""Every schedule family: validity over the grid, the papers' numbers, golden CSVs.

The dependency check here is written apart from the engine: it reads the
timeline back and checks each action's start against its dependencies' ends.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import re

import pytest
from cli_helpers import raises_said
from hypothesis import given
from hypothesis import strategies as st

from stagewise import torch_csv
from stagewise.actions import actions_of
from stagewise.costs import Costs
from stagewise.schedules import FAMILIES, ScheduleArgError, generate, names
from stagewise.simulate import simulate
from stagewise.timeline import metrics
from stagewise.validate import validate

DATA = Path(__file__).parent / "data"
ALL = names()
SPLIT = [n for n in ALL if FAMILIES[n].split_backward]


def grid_args(name: str, p: int, m_hi: int | None = None):
    """(p, m, v) triples a family accepts for this p, m up to 4p."""
    fam = FAMILIES[name]
    if fam.even_ranks and p % 2:
        return []
    out = []
    for v in fam.chunks or (1, 2, 3, 4):
        for m in range(fam.min_microbatches(p, v), (m_hi or 4 * p) + 1):
            if not (fam.even_microbatches and m % 2):
                out.append((p, m, v))
    return out


def check_timeline(tl, latency: float = 0.0) -> None:
    """Each action exactly once, after its dependencies; each rank one op at a time."""
    sched = tl.schedule
    when = {}  # (kind, stage, mb) -> (rank, start, end)
    for r in range(sched.ranks):
        prev_end = 0.0
        for op, start, end in tl.rows(r):
            assert start >= prev_end - 1e-9 and end > start, f"rank {r}: {op} overlaps the op before it"
            prev_end = end
            for a in actions_of(op):
                assert tuple(a) not in when, f"{a} runs twice"
                when[tuple(a)] = (r, start, end)

    def after(a, dep) -> None:
        r, start, _ = when[a]
        dr, _, dep_end = when[dep]
        link = latency if dr != r else 0.0
        assert start >= dep_end + link - 1e-9, f"{a} starts at {start} before {dep} ends at {dep_end} (+{link})"

    for lane in sched.lanes:
        first, last = lane.stage_lo, lane.stage_hi - 1
        for s in lane.stages:
            for mb in lane.mbs:
                grad = ("B", s, mb) if ("B", s, mb) in when else ("I", s, mb)
                assert ("F", s, mb) in when and grad in when, f"stage {s} micro-batch {mb} incomplete"
                if grad[0] == "I":
                    after(("W", s, mb), grad)
                if s > first:
                    after(("F", s, mb), ("F", s - 1, mb))
                after(grad, ("F", s, mb))
                if s < last:
                    up = ("B", s + 1, mb) if ("B", s + 1, mb) in when else ("I", s + 1, mb)
                    after(grad, up)
    expected = sum(len(lane.stages) * len(lane.mbs) for lane in sched.lanes)
    kinds = Counter(k for k, _, _ in when)
    assert kinds["F"] == expected and kinds["B"] + kinds["I"] == expected and kinds["W"] == kinds["I"]


@st.composite
def family_args(draw):
    name = draw(st.sampled_from(ALL))
    fam = FAMILIES[name]
    p = draw(st.integers(1, 16).map(lambda x: x + x % 2 if fam.even_ranks else x))
    args = grid_args(name, p)
    return (name, *draw(st.sampled_from(args)))


@given(family_args(), st.sampled_from([0.0, 0.5]))
def test_every_schedule_on_the_grid_runs_each_action_once_after_its_dependencies(args, latency):
    name, p, m, v = args
    sched = validate(generate(name, p, m, v))
    assert sched.name == name and sched.ranks == p and sched.microbatches == m
    check_timeline(simulate(sched, Costs(t_f=1.0, t_b=2.0, latency=latency)), latency)


@pytest.mark.parametrize("name", ALL)
def test_the_whole_grid_validates_up_to_eight_ranks(name):
    for p in range(1, 9):
        for p_, m, v in grid_args(name, p):
            validate(generate(name, p_, m, v))


@pytest.mark.parametrize("name", ALL)
def test_generation_matches_the_golden_csv(name):
    assert torch_csv.dumps(generate(name, 4, 8)) == (DATA / f"{name}_p4_m8.csv").read_text()


@pytest.mark.parametrize("name", [n for n in ALL if n != "dualpipe"])
def test_one_rank_works(name):
    fam = FAMILIES[name]
    m = max(2, fam.min_microbatches(1, fam.default_chunks))
    check_timeline(simulate(generate(name, 1, m)))


# --- the seed's numbers --------------------------------------------------------------------------

@pytest.mark.parametrize("p, m, expected", [(4, 8, 0.273), (16, 8, 0.652), (16, 32, 0.319)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_the_seed_number(name, p, m, expected):
    bubble = metrics(simulate(generate(name, p, m))).bubble_fraction
    assert bubble == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert round(bubble, 3) == expected


def test_gpipe_holds_all_micro_batches_and_1f1b_only_p_on_rank_0():
    assert metrics(simulate(generate("gpipe", 4, 8))).peak_activations[0] == 8
    assert metrics(simulate(generate("1f1b", 4, 8))).peak_activations[0] == 4


@pytest.mark.parametrize("p, m", [(1, 3), (4, 8), (5, 3), (8, 8), (7, 20)])
def test_1f1b_rank_r_holds_p_minus_r(p, m):
    peaks = metrics(simulate(generate("1f1b", p, m))).peak_activations
    assert list(peaks) == [min(p - r, m) for r in range(p)]


# --- zero bubble ---------------------------------------------------------------------------------

def _peak(name, p, m, v=None):
    sched = generate(name, p, m, v)
    per_stage = 1.0 / sched.chunks  # a chunk of a v-chunk rank is 1/v of a 1F1B stage
    return max(metrics(simulate(sched, Costs(activation=per_stage))).peak_activations)


@given(st.integers(1, 12).flatmap(lambda p: st.tuples(st.just(p), st.integers(1, 4 * p))))
def test_zero_bubble_memory_bounds(pm):
    p, m = pm
    one_f_one_b = _peak("1f1b", p, m)
    assert _peak("zb-h1", p, m) <= one_f_one_b
    assert _peak("zb-v", p, m) <= one_f_one_b
    assert _peak("zb-h2", p, m) <= 2 * p - 1


def _idle(name, p, m, tf=1.0, ti=1.0, tw=1.0):
    v = FAMILIES[name].default_chunks
    costs = Costs(t_f=tf / v, t_b=(ti + tw) / v, t_i=ti / v, t_w=tw / v)  # same model cut in v p stages
    return simulate(generate(name, p, m), costs)


def span_idle(tl) -> list[float]:
    """Idle inside each rank's own span, first start to last end."""
    return [max(en) - min(st) - sum(e - s for s, e in zip(st, en)) for st, en in zip(tl.starts, tl.ends)]


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 13), (8, 16), (6, 30)])
def test_zb_h1_idles_a_third_of_1f1b_when_f_i_w_are_equal(p, m):
    zb = max(metrics(_idle("zb-h1", p, m)).idle)
    ref = max(metrics(_idle("1f1b", p, m)).idle)
    assert zb == pytest.approx(ref / 3) and zb > 0


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 11), (8, 16), (6, 30)])
def test_zb_h2_and_zb_v_idle_less_than_zb_h1_from_m_2p(p, m):
    h1, h2, zv = (_idle(n, p, m) for n in ("zb-h1", "zb-h2", "zb-v"))
    # ZB-V halves the fill: rank p-1 starts after p-1 half-stage forwards
    assert max(metrics(zv).idle) < max(metrics(h1).idle)
    # ZB-H2 is the paper's parallelogram: no idle inside any rank's span (it needs the
    # step-end sync dropped); on a shared step end its staircase equals ZB-H1's (p-1)F,
    # which no one-chunk schedule can beat since rank p-1 cannot start earlier
    assert max(span_idle(h2)) == 0 < max(span_idle(h1))
    assert max(metrics(h2).idle) == pytest.approx(max(metrics(h1).idle)) == pytest.approx(p - 1)


# --- V-Half and V-Min (controllable memory) ----------------------------------------------------

V_SHAPES = [("v-half", 1 / 2, lambda p: (p + 2) // 2), ("v-min", 2 / 3, lambda p: (p + 4) // 3)]


@pytest.mark.parametrize("name, fraction, paper_peak", V_SHAPES)
@pytest.mark.parametrize("p", range(4, 17))
def test_v_shapes_hold_the_papers_peak_and_bubble_for_equal_f_i_w(name, fraction, paper_peak, p):
    # Qi et al. 2024: peak (p+2)//2 and (p+4)//3 micro-batches of a stage (V-ZB and 1F1B: p), bubble rate
    # ~p/2m and ~2p/3m (1F1B's (p-1)/(m+p-1) times 1/2 and 2/3, plus the warm-up V-Min pays), F = I = W
    for m in (2 * p, 4 * p):
        assert _peak(name, p, m) == paper_peak(p) < _peak("zb-v", p, m) == p
        bubble = metrics(_idle(name, p, m)).bubble_fraction
        one_f_one_b = (p - 1) / (m + p - 1)
        assert bubble <= fraction * p / m
        assert bubble <= (0.6 if name == "v-half" else 0.74) * one_f_one_b


@pytest.mark.parametrize("name", ["v-half", "v-min"])
def test_v_shapes_never_exceed_their_peak_for_few_micro_batches(name):
    fam = FAMILIES[name]
    for p in (3, 6, 9):
        for m in range(1, 2 * p + 1):
            assert _peak(name, p, m) == fam.memory(p, m, 2) == min(m, fam.memory(p, 10 * p, 2))


# --- DualPipe -----------------------------------------------------------------------------------

@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 20), (8, 16), (6, 24)])
def test_dualpipe_holds_two_copies_and_pp_plus_one_activations(p, m):
    mt = metrics(simulate(generate("dualpipe", p, m)))
    assert [x * p for x in mt.param_share] == pytest.approx([2.0] * p)
    assert list(mt.peak_activations) == [p + 1] * p  # DualPipe README: PP + 1


@pytest.mark.parametrize("p, m", [(1, 2), (4, 8), (3, 9), (8, 16)])
def test_dualpipe_v_holds_one_copy_and_pp_plus_one_half_chunks(p, m):
    mt = metrics(simulate(generate("dualpipe-v", p, m)))
    assert [x * p for x in mt.param_share] == pytest.approx([1.0] * p)
    assert list(mt.peak_activations) == [2 * p + 1] * p  # PP + 1 chunks, PP = 2p stages


def test_dualpipe_lanes_meet_from_both_ends():
    sched = generate("dualpipe", 4, 8)
    assert [(l.stage_lo, l.stage_hi, l.mb_lo, l.mb_hi) for l in sched.lanes] == [(0, 4, 0, 4), (4, 8, 4, 8)]
    assert sched.placement == (0, 1, 2, 3, 3, 2, 1, 0)
    assert {op.kind for prog in sched.programs for op in prog} == {"F", "B", "I", "W", "F&B"}


# --- arguments ----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (("dualpipe", 5, 10, None), "dualpipe needs an even --ranks; got 5"),
    (("dualpipe", 4, 9, None), "dualpipe needs an even --microbatches; got 9"),
    (("dualpipe", 4, 6, None), "--microbatches >= 2 * --ranks (8); got 6"),
    (("dualpipe-v", 3, 5, None), "--microbatches >= 2 * --ranks (6); got 5"),
    (("interleaved-1f1b", 4, 3, 2), "--microbatches >= --ranks (4); got 3"),
    (("zb-v", 4, 8, 3), "zb-v needs --chunks 2; got 3"),
    (("1f1b", 4, 8, 2), "1f1b needs --chunks 1; got 2"),
    (("gpipe", 0, 8, None), "--ranks must be >= 1; got 0"),
    (("gpipe", 4, -1, None), "--microbatches must be >= 1; got -1"),
    (("looped-bfs", 4, 8, 0), "--chunks must be >= 1; got 0"),
    (("pipedream", 4, 8, None), "unknown schedule 'pipedream'"),
])
def test_bad_arguments_name_the_option_and_the_rule(args, words):
    with raises_said(ScheduleArgError, re.escape(words)):  # `ranks` in the library, --ranks on the CLI
        generate(*args)


def test_interleaved_any_m_from_p_uses_a_valid_megatron_group():
    from stagewise.schedules.interleaved import group_size, schedule_table

    assert group_size(4, 8) == 4 and group_size(4, 5) == 5 and group_size(4, 9) == 5
    assert schedule_table(5, 2, 3) == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (3, 1), (4, 1)]
    for m in range(4, 17):  # the last group is empty or holds >= p micro-batches
        n = group_size(4, m)
        assert 4 <= n <= m and (m % n == 0 or m % n >= 4)
