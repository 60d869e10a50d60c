"""The exact partitioner against brute force, heavy ends, memory limits, and the simulator's memory."""

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise import generate
from stagewise.plan.search import holding
from stagewise.plan.search import LayerCosts, evaluate, partition

sys.path.insert(0, str(Path(__file__).parent))
from plan_fixtures import gpt_profile  # noqa: E402


def compositions(total, parts):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        b = (0, *cuts, total)
        yield tuple(b[k + 1] - b[k] for k in range(parts))


def brute(lc, h, limit):
    """(best bottleneck among splits that fit, or None)."""
    fits = [evaluate(lc, h, c, limit) for c in compositions(len(lc.time), h.pieces)]
    fits = [p for p in fits if p.fits]
    return min(p.bottleneck for p in fits) if fits else None


layer_lists = st.integers(3, 8).flatmap(lambda n: st.tuples(
    st.lists(st.integers(1, 9), min_size=n, max_size=n),
    st.lists(st.integers(0, 5), min_size=n, max_size=n),
    st.lists(st.integers(0, 5), min_size=n, max_size=n)))


def costs(layers, recompute=False):
    time, fixed, act = layers
    inputs = tuple(float(1 + (i % 2)) for i in range(len(time))) if recompute else None
    return LayerCosts(time=tuple(map(float, time)), fixed=tuple(map(float, fixed)), act=tuple(map(float, act)),
                      input_bytes=inputs)


def assert_exact(lc, h, limit):
    """The partitioner's bottleneck is brute force's, and both agree on whether anything fits."""
    got = partition(lc, h, limit)
    want = brute(lc, h, limit)
    if want is None:
        assert not got.fits
    else:
        assert got.fits and got.bottleneck == pytest.approx(want)


@given(layer_lists, st.sampled_from([2, 3, 4]), st.sampled_from([None, 6.0, 12.0, 25.0]), st.booleans())
def test_one_stage_per_rank_equals_brute_force(layers, p, limit, recompute):
    lc = costs(layers, recompute)
    if p > len(lc.time):
        return
    h = holding(generate("1f1b", p, 2 * p))
    assert_exact(lc, h, limit)


@settings(max_examples=15)
@given(layer_lists, st.sampled_from([("interleaved-1f1b", 2, 2), ("zb-v", 2, 2), ("dualpipe", 2, 2),
                                     ("looped-bfs", 2, 2)]), st.sampled_from([None, 15.0, 30.0]), st.booleans())
def test_several_stages_per_rank_equals_brute_force(layers, fam, limit, recompute):
    lc = costs(layers, recompute)
    name, p, v = fam
    h = holding(generate(name, p, 4, v))
    if h.pieces > len(lc.time):
        return
    assert_exact(lc, h, limit)


def test_heavy_embedding_and_head_get_fewer_layers():
    prof = gpt_profile(blocks=30, embed=4.0, head=5.0)
    from stagewise.plan.search import layer_costs

    lc = layer_costs(prof, 1, False, 4.0)
    part = partition(lc, holding(generate("1f1b", 4, 8)), None)
    first, *middle, last = part.counts
    assert first - 1 < min(middle) and last - 1 < min(middle)  # E and H cost 4 and 5 blocks
    assert sum(part.counts) == 32


def test_memory_limit_respected_and_moves_layers():
    lc = LayerCosts(time=(1.0,) * 12, fixed=(1.0,) * 12, act=(1.0,) * 12)
    h = holding(generate("1f1b", 3, 6))  # rank 0 holds 3 activations, rank 2 holds 1
    free = partition(lc, h, None)
    assert free.counts == (4, 4, 4)
    limit = 14.0  # rank 0: 4 layers x (1 + 3) = 16 > 14
    capped = partition(lc, h, limit)
    assert capped.fits and max(capped.rank_memory) <= limit
    assert capped.counts[0] < 4 and capped.counts[2] > 4
    assert brute(lc, h, limit) == pytest.approx(capped.bottleneck)


def test_nothing_fits_returns_fastest_marked():
    lc = LayerCosts(time=(1.0,) * 6, fixed=(10.0,) * 6, act=(1.0,) * 6)
    part = partition(lc, holding(generate("1f1b", 2, 4)), 5.0)
    assert not part.fits and part.counts == (3, 3)


def test_partition_memory_equals_the_simulated_memory():
    """The partitioner's memory per rank (fixed + live activations at the peak) is the search's figure."""
    from stagewise.plan.search import Cluster
    from stagewise.plan.search import Config, Searcher

    prof = gpt_profile(blocks=8)
    cl = Cluster(devices=2, per_node=2, memory=None, intra=prof.link, inter=prof.link)
    s = Searcher(profile=prof, cluster=cl, global_batch=8)
    from stagewise.plan.search import layer_costs

    for fam, v, rc in (("1f1b", 1, False), ("zb-h2", 1, True), ("zb-v", 2, False), ("dualpipe", 2, True)):
        c = Config(family=fam, p=2, dp=1, v=v, m=8, mbs=1, recompute=rc)
        s._schedule(fam, 2, 8, v)
        cand = s.evaluate(c)
        h = holding(cand.schedule)
        part = evaluate(layer_costs(prof, 1, rc, cl.state_factor), h, cand.counts)
        assert part.rank_memory == pytest.approx(cand.memory)


def test_more_pieces_than_layers_is_an_error():
    from stagewise.plan.search import PartitionError

    lc = LayerCosts(time=(1.0,) * 3, fixed=(0.0,) * 3, act=(0.0,) * 3)
    with pytest.raises(PartitionError, match="4 stages need at least 4 layers"):
        partition(lc, holding(generate("1f1b", 4, 4)), None)


@settings(max_examples=20)
@given(st.integers(2, 9), st.integers(1, 9), st.integers(0, 9), st.integers(0, 9),
       st.sampled_from([("interleaved-1f1b", 2, 2), ("zb-v", 2, 2), ("looped-bfs", 3, 2), ("interleaved-1f1b", 2, 3)]))
def test_transformer_shape_fast_path_equals_brute_force(blocks, t, e, hd, fam):
    """E, t*n, H with no memory limit takes the water-filling path: still the exact optimum."""
    from stagewise.plan.search.partition import _waterfill

    time = [float(e)] * (e > 0) + [float(t)] * blocks + [float(hd)] * (hd > 0)
    lc = LayerCosts(time=tuple(time), fixed=(0.0,) * len(time), act=(0.0,) * len(time))
    name, p, v = fam
    h = holding(generate(name, p, 2 * p, v))
    if h.pieces > len(time):
        return
    assert _waterfill(lc, h) is not None
    assert partition(lc, h, None).bottleneck == pytest.approx(brute(lc, h, None))


@pytest.mark.parametrize("fam", ["zb-v", "v-half", "dualpipe", "dualpipe-v", "interleaved-1f1b"])
def test_two_stage_peaks_equal_the_general_scan(fam):
    """A rank of two stages takes the two-counter scan and staircase: the same undominated peaks as the
    general scan (forced by a third stage the rank never runs, its count always 0)."""
    from stagewise.plan.search.holding import _live_two, _live_vectors

    for p, m in itertools.product((2, 4, 6), (1, 3, 8, 13)):
        try:
            sched = generate(fam, p, m, 2)
        except ValueError:
            continue
        for r in range(p):
            stages = tuple(sched.stages_of_rank(r))
            general = {v[:2] for v in _live_vectors(sched.programs[r], stages + (-1,))}
            assert _live_two(sched.programs[r], stages) == tuple(sorted(general))
