"""The data-parallel reduction overlapped with the backward, on timelines small enough to check by hand."""

import pytest

from stagewise.costs import Costs
from stagewise.plan.cluster import exposed_reduction, reduce_scatter_time
from stagewise.plan.search import Link
from stagewise.schedules import generate
from stagewise.simulate import simulate

ONE = Link(latency=0.0, bandwidth=1.0)  # dp = 2: a layer of 1 byte takes 1 time unit (fp32 doubles, ring halves)


def test_reduce_scatter_is_a_ring():
    assert reduce_scatter_time(8.0, 4, Link(latency=0.5, bandwidth=2.0)) == pytest.approx(3 * 0.5 + 3 / 4 * 4.0)
    assert reduce_scatter_time(8.0, 1, ONE) == 0.0


def test_layers_reduce_as_the_last_backward_passes_them():
    # 1F1B, p = 1, m = 2: F 0-1, F 1-2, B 2-4, B 4-6; four layers ready at 4.5, 5, 5.5, 6, one unit each
    tl = simulate(generate("1f1b", 1, 2, 1), Costs(t_f=1, t_b=2))
    assert exposed_reduction(tl, [[1.0] * 4], (0,), 2, ONE) == pytest.approx(8.5 - 6)
    assert exposed_reduction(tl, [[1.0] * 4], (0,), 2, ONE, all_reduce=True) == pytest.approx(12.5 - 6)
    assert exposed_reduction(tl, [[1.0] * 4], (0,), 1, ONE) == 0.0


def test_breadth_first_hides_more():
    # looped BFS, p = 1, v = 2: stage 1's backwards end at 4, so its layers reduce while stage 0's run
    tl = simulate(generate("looped-bfs", 1, 2, 2), Costs(t_f=0.5, t_b=1))
    assert max(tl.ends[0]) == pytest.approx(6)
    assert exposed_reduction(tl, [[1.0] * 2, [1.0] * 2], (0, 1), 2, ONE) == pytest.approx(7.5 - 6)
