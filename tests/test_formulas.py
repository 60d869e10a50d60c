"""The closed forms agree with the simulator exactly where they are given, and are None elsewhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stagewise.costs import Costs
from stagewise.formulas import bubble_fraction, busy_per_rank, idle_per_rank
from stagewise.schedules import FAMILIES, generate, names
from stagewise.simulate import simulate
from stagewise.timeline import metrics

times = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])


def _check(name, p, m, v, costs):
    sched = generate(name, p, m, v)
    mt = metrics(simulate(sched, costs))
    idle = idle_per_rank(name, p, m, sched.chunks, costs)
    assert idle is not None
    assert max(mt.idle) == pytest.approx(idle)
    assert mt.bubble_fraction == pytest.approx(bubble_fraction(name, p, m, sched.chunks, costs))


@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 12), st.integers(1, 40), times, times)
def test_gpipe_and_1f1b_idle_p_minus_1_f_plus_b_for_any_m(name, p, m, f, b):
    _check(name, p, m, 1, Costs(t_f=f, t_b=b))


@given(st.sampled_from(["interleaved-1f1b", "looped-bfs"]), st.integers(1, 8), st.integers(1, 4), st.data(), times, times)
def test_interleaved_and_looped_bfs_any_m_from_p(name, p, v, data, f, b):
    m = data.draw(st.integers(p, 4 * p))  # not only multiples of p
    _check(name, p, m, v, Costs(t_f=f, t_b=b))


@given(st.integers(1, 10), st.data(), times, times, times)
def test_zb_h1_idle_is_p_minus_1_times_f_plus_b_minus_2w(p, data, f, i, w):
    m = data.draw(st.integers(p, 4 * p))
    costs = Costs(t_f=f, t_b=i + w, t_i=i, t_w=w)
    if w <= min(f, i):
        _check("zb-h1", p, m, 1, costs)
    else:  # W longer than F or I: the form undercuts the (p-1)F fill no schedule avoids
        assert idle_per_rank("zb-h1", p, m, 1, costs) is None


@given(st.sampled_from(["dualpipe", "dualpipe-v"]), st.integers(1, 8), st.data(), times, st.sampled_from([2 / 3, 0.75, 0.9, 1.0]))
def test_dualpipe_idle_is_half_pp_minus_1_times_fb_plus_b_minus_3w(name, p, data, t, overlap):
    if name == "dualpipe":
        p += p % 2
    m = 2 * data.draw(st.integers(p, 2 * p))
    # the DeepSeek-V3 table counts F = I = W; an F&B pair costs from B (F hidden) to F + B
    _check(name, p, m, 2, Costs(t_f=t, t_b=2 * t, t_fb=overlap * 3 * t))


def test_dualpipe_form_is_withheld_where_it_is_not_exact():
    assert idle_per_rank("dualpipe", 4, 8, 2, Costs(t_f=1, t_b=3)) is None  # F != I = W
    assert idle_per_rank("dualpipe", 4, 8, 2, Costs(t_fb=1.9)) is None  # the pair faster than its B
    assert idle_per_rank("dualpipe-v", 4, 8, 2, Costs(t_fb=3.5)) is None  # the pair slower than F + B


@pytest.mark.parametrize("name", names())
def test_busy_per_rank_is_exact_for_every_family(name):
    fam = FAMILIES[name]
    p = 4
    m = max(8, fam.min_microbatches(p, fam.default_chunks))
    costs = Costs(t_f=1.0, t_b=2.5, t_fb=2.75)
    sched = generate(name, p, m)
    assert busy_per_rank(name, p, m, sched.chunks, costs) == pytest.approx(metrics(simulate(sched, costs)).busy)


def test_dualpipe_busy_counts_m_visits_per_rank_not_m_times_v():
    # two stages per rank, each fed half of the micro-batches
    assert busy_per_rank("dualpipe", 4, 8, 2, Costs()) == [24.0] * 4
    assert busy_per_rank("dualpipe-v", 4, 8, 2, Costs()) == [48.0] * 4


@pytest.mark.parametrize("name, p, m, costs", [
    ("zb-h2", 4, 8, Costs()),  # zero bubble only without the step-end synchronisation
    ("zb-v", 4, 8, Costs()),
    ("looped-bfs", 4, 3, Costs()),  # m < p: bubbles between the loops
    ("zb-h1", 4, 3, Costs()),
    ("1f1b", 4, 8, Costs(latency=0.1)),
    ("1f1b", 4, 8, Costs(t_f=[1, 1, 1, 2])),
    ("1f1b", 4, 8, Costs(t_i=1.5, t_w=1.0)),  # I + W != B
    ("from-a-csv", 4, 8, Costs()),
])
def test_no_closed_form(name, p, m, costs):
    assert idle_per_rank(name, p, m, 1, costs) is None
    assert bubble_fraction(name, p, m, 1, costs) is None


# --- family knowledge lives with the family -------------------------------------------------------

@pytest.mark.parametrize("name", names())
def test_parameter_copies_in_the_registry_are_what_the_placement_holds(name):
    fam = FAMILIES[name]
    sched = generate(name, 4, max(8, fam.min_microbatches(4, fam.default_chunks)))
    assert sum(sched.param_share()) == pytest.approx(fam.param_copies)


@pytest.mark.parametrize("name", [n for n in names() if FAMILIES[n].memory is not None])
@pytest.mark.parametrize("p", [1, 2, 4, 7, 16])
def test_memory_forms_are_the_simulated_peak_in_rank_shares(name, p):
    from stagewise.costs import rank_share_weights, scaled

    fam = FAMILIES[name]
    p += p % 2 if fam.even_ranks else 0
    for m in sorted({max(1, fam.min_microbatches(p, fam.default_chunks)), p, 2 * p + 1, 2 * p + 2}):
        if m < fam.min_microbatches(p, fam.default_chunks) or (fam.even_microbatches and m % 2):
            continue
        sched = generate(name, p, m)
        costs = scaled(Costs(), rank_share_weights(sched), durations=False)  # a chunk keeps 1/v of a rank's share
        peak = max(metrics(simulate(sched, costs)).peak_activations)
        assert peak == pytest.approx(fam.memory(p, m, sched.chunks)), (p, m)


def test_dualpipe_pairs_come_from_the_generators_own_step_lengths():
    from stagewise.actions import Pair

    for name, p, m in [("dualpipe", 6, 14), ("dualpipe-v", 5, 12)]:
        sched = generate(name, p, m)
        counted = [sum(type(op) is Pair for op in prog) for prog in sched.programs]
        assert FAMILIES[name].pairs(p, m) == counted


def test_formulas_do_not_know_family_names():
    import inspect

    import stagewise.formulas as f

    assert not any(n in inspect.getsource(f) for n in ('"1f1b"', '"dualpipe"', '"zb-h1"'))
