"""The per-step work outside the layers, measured on the runtime (profiling/step_overhead.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")

from stagewise.plan.search.overhead import KEY, step_overhead  # noqa: E402


@pytest.mark.slow
def test_profile_measures_the_overhead_on_the_runtime():
    """Two short 1F1B runs on 2 local ranks; the fit explains what the layers alone do not."""
    from stagewise.profiling.link import measure_link
    from stagewise.profiling.measure import profile_model
    from stagewise.profiling.step_overhead import measure_overhead
    from stagewise.runtime.run.models import GPTConfig

    prof = profile_model(GPTConfig(layers_n=2, d_model=32, seq=8), (1,), repeats=3, threads=1)
    prof = replace(prof, link=measure_link(sizes=(1 << 10, 1 << 16), repeats=3))
    fit = measure_overhead(prof, (2, 4), steps=3, rounds=1)
    assert fit["fixed_s"] >= 0 and fit["per_action_s"] >= 0 and fit["slowdown"] >= 0
    assert [n for n, _ in fit["samples"]] == [4, 8]  # 1F1B on 2 ranks: 2m actions on each
    worst = max(abs(r) for _, r in fit["samples"])
    for n, _ in fit["samples"]:  # a least-squares line through two points stays within what was measured
        bound = worst + 1e-9
        assert step_overhead(replace(prof, meta={KEY: {**fit, "slowdown": 0.0}}), n) <= bound  # structural: a fit
