"""The configuration search: what it enumerates, how it ranks, and its caches."""

import sys
from pathlib import Path

import pytest

from stagewise.plan.search import Cluster, parse_bytes
from stagewise.plan.errors import PlanError
from stagewise.plan.search import Link
from stagewise.plan.search import Searcher, Space, search

sys.path.insert(0, str(Path(__file__).parent))
from plan_fixtures import gpt_profile  # noqa: E402


def run(devices=4, batch=16, memory=None, space=Space(), **kw):
    prof = gpt_profile(**kw)
    cl = Cluster(devices=devices, per_node=devices, memory=memory, intra=prof.link, inter=prof.link)
    s = Searcher(profile=prof, cluster=cl, global_batch=batch, space=space)
    return s, search(s)


def test_enumerates_every_p_dp_family_v_size_recompute():
    s, cands = run()
    got = {(c.config.p, c.config.dp) for c in cands}
    assert got == {(1, 4), (2, 2), (4, 1)}
    assert {c.config.recompute for c in cands} == {False, True}
    assert {c.config.mbs for c in cands} == {1, 2}
    assert {c.config.family for c in cands} >= {"1f1b", "gpipe", "zb-h1", "zb-v", "interleaved-1f1b"}
    for c in cands:
        g = c.config
        assert g.p * g.dp == 4 and g.m * g.dp * g.mbs == 16 and sum(c.counts) == 10
        assert len(c.counts) == c.schedule.stages // (2 if g.family == "dualpipe" else 1) or g.v > 1


def test_one_stage_is_planned_as_1f1b_unless_a_family_is_named():
    """On one stage every family is gradient accumulation: left to itself the search plans p = 1 as 1f1b (gpipe
    and the split backwards there are the same work, held longer or cut in two); a family asked for by name is
    planned at p = 1 too."""
    _, cands = run()
    assert {c.config.family for c in cands if c.config.p == 1} == {"1f1b"}
    assert {c.config.family for c in cands if c.config.p == 2} >= {"gpipe", "zb-h1", "1f1b"}
    _, named = run(space=Space(families=("gpipe", "zb-h1")))
    assert {c.config.family for c in named if c.config.p == 1} == {"gpipe", "zb-h1"}


def test_ranking_fits_first_then_fastest():
    _, cands = run(memory=30e6)
    fits = [c.fits for c in cands]
    assert fits == sorted(fits, reverse=True) and any(fits) and not all(fits)
    times = [c.step_time for c in cands if c.fits]
    assert times == sorted(times)
    assert all(max(c.memory) <= 30e6 for c in cands if c.fits)


def test_step_time_is_makespan_plus_allreduce_plus_optimizer():
    _, cands = run()
    for c in cands[:20]:
        assert c.step_time == pytest.approx(c.makespan + c.allreduce + c.optimizer)
        assert (c.allreduce == 0) == (c.config.dp == 1 and c.config.p == 1)  # dp gradients; the loss over p
        assert c.throughput == pytest.approx(16 / c.step_time)


def test_recompute_trades_time_for_memory():
    _, cands = run()
    by = {}
    for c in cands:
        g = c.config
        by.setdefault((g.family, g.p, g.v, g.m), {})[g.recompute] = c
    pairs = [d for d in by.values() if len(d) == 2]
    assert pairs
    for d in pairs:
        assert d[True].makespan > d[False].makespan
        assert max(d[True].activations) < max(d[False].activations)


def test_big_gradients_favour_pipelines_big_activations_favour_data_parallel():
    link = Link(latency=0.0, bandwidth=1e7)
    cl = Cluster(devices=4, per_node=4, memory=None, intra=link, inter=link)
    heavy_weights = gpt_profile(blocks=8, params=1e8, io=1.0)
    assert search(Searcher(profile=heavy_weights, cluster=cl, global_batch=32))[0].config.dp == 1
    heavy_activations = gpt_profile(blocks=8, params=1.0, io=1e8)
    assert search(Searcher(profile=heavy_activations, cluster=cl, global_batch=32))[0].config.p == 1


def test_fixed_layout():
    s, cands = run(space=Space(counts=(4, 6), families=("1f1b", "zb-v")))
    assert cands and all(c.counts == (4, 6) for c in cands)
    # zb-v's two stages on one rank would be gradient accumulation: never searched (p=1 takes v=1 only)
    assert {(c.config.family, c.config.p) for c in cands} == {("1f1b", 2)}


def test_even_split_divides_the_blocks_and_skips_what_it_cannot():
    """8 blocks with a heavy head: even gives each of the p x v stages the same blocks (the embedding with the
    first, the head with the last) where balanced moves blocks off the head's stage; p=4 with v=4 (16 stages)
    cannot divide 8 blocks and is skipped."""
    _, even = run(space=Space(families=("1f1b", "interleaved-1f1b"), chunks=(2, 4), split="even"))
    _, balanced = run(space=Space(families=("1f1b", "interleaved-1f1b"), chunks=(2, 4)))
    assert even and all(len(set(c.counts[1:-1] + (c.counts[0] - 1, c.counts[-1] - 1))) == 1 for c in even)
    assert {(c.config.p, c.config.v, c.counts) for c in even if c.config.p == 2 and c.config.v == 1} == {
        (2, 1, (5, 5))}
    assert {(c.config.p, c.config.v) for c in even} == {(1, 1), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2)}
    best = lambda cands, p: min(c.step_time for c in cands if (c.config.p, c.config.v) == (p, 1))  # noqa: E731
    assert best(balanced, 4) < best(even, 4)
    with pytest.raises(PlanError, match="split 'lumpy'"):
        Space(split="lumpy")


def test_no_valid_p_dp_is_a_clear_error():
    with pytest.raises(PlanError, match=r"no configuration: --devices 13 gives p x dp in \{1x13, 13x1\}"):
        run(devices=13, batch=8)


def test_schedules_and_partitions_are_cached():
    s, cands = run(devices=2, batch=32)
    assert len(s._schedules) < len(cands)
    # one partition per (placement, size, recompute): 1f1b at m = 16 and 32 share theirs
    assert len(s._partitions) < len(cands) / 2


def test_parse_bytes():
    assert parse_bytes("80GiB", "--memory") == 80 * 2**30
    assert parse_bytes("25GB/s", "--x") == 25e9
    assert parse_bytes("1e6", "--x") == 1e6
    with pytest.raises(PlanError, match="--memory '80 parsecs'"):
        parse_bytes("80 parsecs", "--memory")


def test_fast_timing_and_memory_equal_the_simulators_metrics():
    """The search reads makespan, bubble and peak bytes without metrics()'s memory pass: same numbers."""
    from stagewise import metrics, simulate
    from stagewise.plan.search import holding
    from stagewise.plan.search import stage_costs
    from stagewise.plan.search import peak_activation_bytes, timing

    s, cands = run(devices=2, batch=8)
    for c in cands[::7]:
        g = c.config
        h = holding(c.schedule)
        costs = stage_costs(s.profile, c.counts, h, g.mbs, g.recompute, s.cluster, g.p, g.dp)
        mt = metrics(simulate(c.schedule, costs))
        assert timing(simulate(c.schedule, costs)) == pytest.approx((mt.makespan, mt.bubble_fraction))
        got = peak_activation_bytes(h, costs.resolve(c.schedule.stages).activation_bytes)
        assert got == pytest.approx(mt.peak_activation_bytes)


def test_tied_embedding_and_head_cost_a_step_end_all_reduce_across_ranks():
    from dataclasses import replace

    from stagewise.plan.search import Cluster
    from stagewise.plan.search import holding
    from stagewise.plan.search import step_sync_time

    prof = gpt_profile(blocks=4)
    link = Link(latency=1.0, bandwidth=1e6)
    cl = Cluster(devices=2, per_node=2, memory=None, intra=link, inter=link)
    tied = replace(prof, tied=(((0, 5), 2e6),))
    from stagewise import generate

    h = holding(generate("1f1b", 2, 4))
    loss_only = step_sync_time(prof, (3, 3), h, cl, 2, 1)
    assert loss_only == pytest.approx(2 * 1.0)  # one ring all-reduce of a scalar over 2 ranks
    assert step_sync_time(tied, (3, 3), h, cl, 2, 1) == pytest.approx(loss_only + 2 * (1.0 + 2e6 / 2 / 1e6))
    hv = holding(generate("zb-v", 2, 4))  # the V puts the embedding and the head on rank 0
    assert step_sync_time(tied, (1, 2, 2, 1), hv, cl, 2, 1) == pytest.approx(loss_only)


def test_the_dp_all_reduce_is_the_lowered_programs_and_overlaps_the_backward():
    """A local plan's replicas reduce each stage's gradients after its last backward, asynchronously, as the
    runtime does (its lowered program, played): on one stage that is after the last op, the whole ring
    all-reduce exposed; with two 1F1B stages rank 0's last backward ends the step, so its ring is exposed and
    the last stage's hides behind that drain."""
    from itertools import accumulate

    s, cands = run(devices=4, batch=16, space=Space(families=("1f1b",), recompute=(False,)))
    link = s.cluster.intra
    seen = set()
    for c in cands:
        g = c.config
        bounds = [0, *accumulate(c.counts)]
        stage_bytes = [sum(x.param_bytes for x in s.profile.layers[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
        ring = [2 * (g.dp - 1) * (link.latency + b / g.dp / link.bandwidth) for b in stage_bytes]
        if g.p == 1 and g.dp > 1:
            assert c.allreduce == pytest.approx(ring[0])
            seen.add(1)
        if g.p == 2:
            assert ring[0] <= c.allreduce < ring[0] + ring[1]  # (the loss's sum over p is in it too)
            seen.add(2)
    assert seen == {1, 2}
