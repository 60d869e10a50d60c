"""The block water-fill equals the exact partitioner where it claims to, and respects memory elsewhere."""

import sys
from pathlib import Path

import pytest

from stagewise.plan.search import block_split, is_block_model
from stagewise.plan.search import holding
from stagewise.plan.search import layer_costs
from stagewise.plan.search import best_split, evaluate
from stagewise.schedules import generate

sys.path.insert(0, str(Path(__file__).parent))
from plan_fixtures import gpt_profile  # noqa: E402


@pytest.mark.parametrize("blocks, head, p, m", [(8, 3.0, 4, 8), (12, 0.6, 4, 4), (9, 0.01, 3, 6), (6, 2.0, 1, 2)])
@pytest.mark.parametrize("limit", [None, 9e6, 7e6])
def test_one_stage_per_rank_matches_the_exact_split(blocks, head, p, m, limit):
    lc = layer_costs(gpt_profile(blocks=blocks, head=head), 1, False, 4.0)
    assert is_block_model(lc)
    h = holding(generate("1f1b", p, m, 1))
    fast, exact = block_split(lc, h, limit), best_split(lc, h, limit)
    assert (fast is None) == (exact is None)
    if exact is not None:
        assert evaluate(lc, h, fast).bottleneck == pytest.approx(evaluate(lc, h, exact).bottleneck)
        assert evaluate(lc, h, fast, limit).fits


def test_several_pieces_per_rank_fit_the_limit():
    lc = layer_costs(gpt_profile(blocks=16, head=0.6), 1, False, 4.0)
    h = holding(generate("interleaved-1f1b", 4, 8, 2))
    free = block_split(lc, h, None)
    assert free == best_split(lc, h, None)  # no limit: the water-fill is exact
    need = max(evaluate(lc, h, free).rank_memory)
    tight = block_split(lc, h, need * 0.95)
    assert tight is not None and evaluate(lc, h, tight, need * 0.95).fits


def test_heavy_ends_get_fewer_blocks():
    lc = layer_costs(gpt_profile(blocks=14, embed=0.5, head=0.6), 1, False, 4.0)
    counts = block_split(lc, holding(generate("1f1b", 4, 8, 1)), None)
    blocks = [counts[0] - 1, *counts[1:-1], counts[-1] - 1]
    assert blocks == [3, 4, 4, 3]


def test_dualpipe_pieces_on_two_ranks_are_split_within_the_limit():
    lc = layer_costs(gpt_profile(blocks=12, head=0.6), 1, False, 4.0)
    h = holding(generate("dualpipe", 4, 8, 2))
    free = block_split(lc, h, None)
    assert sum(free) == len(lc.time) and len(free) == h.pieces
    exact = best_split(lc, h, None)
    assert evaluate(lc, h, free).bottleneck <= evaluate(lc, h, exact).bottleneck * 1.15
    need = max(evaluate(lc, h, free).rank_memory)
    tight = block_split(lc, h, need)
    assert tight is not None and evaluate(lc, h, tight, need).fits


def test_dualpipe_without_a_limit_breaks_load_ties_by_memory():
    """Issue 45: without a limit DualPipe's greedy still fills, of two pieces as loaded, the one with fewer
    micro-batches in flight first, so the split a plan reports when nothing fits needs what the same greedy
    needs under any limit it meets, and less than the even split at no more time."""
    lc = layer_costs(gpt_profile(blocks=30, head=0.6), 1, False, 4.0)
    h = holding(generate("dualpipe", 8, 16, 2))
    free = block_split(lc, h, None)
    assert free == block_split(lc, h, 1e30)
    even = (5,) + (4,) * 6 + (3,)  # 8 pieces: E + 4 blocks, 4 blocks each, 2 blocks + H
    got, base = evaluate(lc, h, free), evaluate(lc, h, even)
    assert max(got.rank_memory) < max(base.rank_memory) and got.bottleneck <= base.bottleneck * (1 + 1e-9)


@pytest.mark.parametrize("family, p, m, v", [("1f1b", 4, 8, 1), ("interleaved-1f1b", 4, 8, 2), ("zb-v", 4, 8, 2),
                                             ("dualpipe", 4, 8, 2)])
@pytest.mark.parametrize("recompute", [False, True])
def test_the_closed_form_memory_of_identical_blocks_is_the_partitioners(family, p, m, v, recompute):
    """What the water-fill checks after each block (``_BlockMemory``) is ``partition._rank_memory`` of the same
    split, for one and several pieces per rank, DualPipe's two lanes, with and without recomputation (the
    closed form also counts the head in the last piece while the blocks are still being placed)."""
    import random

    from stagewise.plan.search.block_split import _BlockMemory, _span, _stages_order
    from stagewise.plan.search.partition import _rank_memory, _Sums

    lc = layer_costs(gpt_profile(blocks=20, head=0.6), 1, recompute, 4.0)
    h = holding(generate(family, p, m, v))
    fast, sums, rng = _BlockMemory.of(lc, h), _Sums(lc), random.Random(7)
    for _ in range(20):
        n = [0 if k in (0, h.pieces - 1) else 1 for k in range(h.pieces)]
        for _ in range(20 - sum(n)):  # a whole split of the 20 blocks
            n[rng.randrange(h.pieces)] += 1
        for r in range(h.ranks):
            exact = _rank_memory(sums, h, r, [_span(n, k) for k in _stages_order(h, r)])
            assert fast.rank(r, n) == pytest.approx(exact)
            assert fast.rank(r, n) == fast._rank(r, n)  # the hot path's folded sums: the same floats


def test_busiest_floor_is_the_best_whole_block_split():
    """The schedule-free bound on the busiest rank is the least any split of whole blocks reaches, the end
    layers anywhere (brute force over small splits), for one model copy and DualPipe's two."""
    import itertools
    import random

    from stagewise.plan.search import busiest_floor

    def brute(time, ranks, copies):
        t, blocks = time[1], copies * (len(time) - 2)
        best = float("inf")
        for where in itertools.product(range(ranks), repeat=2 * copies):
            ends = [0.0] * ranks
            for x, r in zip([time[0]] * copies + [time[-1]] * copies, where):
                ends[r] += x
            for bars in itertools.combinations(range(blocks + ranks - 1), ranks - 1):  # every n summing to blocks
                n = [b - a - 1 for a, b in zip((-1, *bars), (*bars, blocks + ranks - 1))]
                best = min(best, max(e + k * t for e, k in zip(ends, n)))
        return best / copies

    rng = random.Random(1)
    for _ in range(150):
        ranks, copies = rng.randint(1, 4), rng.choice([1, 2])
        t = rng.choice([1.0, 0.7, 1.3])
        time = [rng.choice([0.0, 0.2, 1.5, 2.6]), *[t] * rng.randint(1, 6), rng.choice([0.1, 0.9, 3.1])]
        assert busiest_floor(time, ranks, copies) == pytest.approx(brute(time, ranks, copies), rel=1e-8)
        assert busiest_floor(time, ranks, copies) <= brute(time, ranks, copies)
    assert busiest_floor([0.1, 1.0, 2.0, 0.1], 2) == 0.0  # blocks that differ: no bound beyond the average


def test_ties_to_later_pieces_are_as_balanced_and_within_the_limit():
    lc = layer_costs(gpt_profile(blocks=21, head=0.6), 1, False, 4.0)
    h = holding(generate("interleaved-1f1b", 4, 8, 2))
    first, later = block_split(lc, h, None), block_split(lc, h, None, later=True)
    assert first != later and evaluate(lc, h, later).bottleneck == pytest.approx(evaluate(lc, h, first).bottleneck)
    need = max(evaluate(lc, h, first).rank_memory)
    tight = block_split(lc, h, need, later=True)
    assert tight is not None and evaluate(lc, h, tight, need).fits
