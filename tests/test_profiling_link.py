"""The point-to-point link between two local ranks (profiling/link.py)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")


def test_link_fit():
    from stagewise.profiling.link import fit_link

    lat, bw = fit_link([(1e3, 1e-5 + 1e3 / 1e9), (1e6, 1e-5 + 1e6 / 1e9), (4e6, 1e-5 + 4e6 / 1e9)])
    assert lat == pytest.approx(1e-5, rel=1e-6) and bw == pytest.approx(1e9, rel=1e-6)
    lat, bw = fit_link([(1e3, 2e-3), (4e6, 2e-3)])  # latency-bound: the bandwidth is only bounded below
    assert lat == pytest.approx(2e-3) and bw >= 4e6 / 2e-3


@pytest.mark.slow
def test_measuring_uses_the_runtime_launcher():
    from stagewise.profiling.link import measure_link
    from stagewise.runtime.launching.launch import RankFailure
    from stagewise.runtime.launching.local import launch

    with pytest.raises(RankFailure, match="every rank: ValueError: math domain error"):
        launch(math.log, 2, 0.0)  # a failure on the ranks comes back named
    link = measure_link(sizes=(1 << 10, 1 << 16), repeats=2)
    assert link.latency >= 0 and link.bandwidth > 0 and len(link.samples) == 2
