"""`plan --verify` for real: a small built-in GPT on 2 local gloo ranks, predicted vs measured.

Generous tolerances (a shared 2-core machine); benchmarks/bench_plan_fidelity.py has the exact figures.
"""

import pytest

pytest.importorskip("torch")

from stagewise.plan.cluster import Cluster  # noqa: E402
from stagewise.plan.measure import profile_model  # noqa: E402
from stagewise.plan.profile import Link  # noqa: E402
from stagewise.plan.search import Searcher, Space, search  # noqa: E402
from stagewise.plan.verify import verify, verify_table  # noqa: E402


@pytest.mark.slow
def test_verify_runs_the_top_configurations_and_predicts_them():
    from stagewise.runtime.models import GPTConfig

    gpt = GPTConfig(layers_n=2, d_model=256, heads=4, seq=128, vocab=64)
    prof = profile_model(gpt, (2, 4), repeats=3, warmup=1, threads=1)
    link = Link(latency=5e-4, bandwidth=1e9)  # about gloo on loopback here (the profiler can measure it)
    cl = Cluster(devices=2, per_node=2, memory=None, intra=link, inter=link)
    space = Space(families=("1f1b", "zb-h1", "gpipe"), recompute=(False,))
    cands = [c for c in search(Searcher(profile=prof, cluster=cl, global_batch=8, space=space)) if c.config.dp == 1]
    rows = verify(prof, cands, 2, steps=4, rounds=1, log=None)
    assert [r["config"] for r in rows] == [c.config.label() for c in cands[:2]]
    for r in rows:  # the best step: other sessions' load on this machine inflates the median, not the best
        assert r["measured_step"] >= r["measured_best"] > 0
        # a factor of 2.5 either way: under other sessions' load (load average 5-10 on 2 cores) the best of
        # 4 steps measured twice the prediction; a quiet machine is within 10-15% (bench_plan_fidelity.py)
        assert 0.4 < r["predicted_step"] / r["measured_best"] < 2.5
        assert all(m is not None and 0.5 < m / p < 2.0 for p, m in zip(r["predicted_activations"],
                                                                         r["measured_activations"]))
    fastest = min(r["measured_best"] for r in rows)
    assert rows[0]["measured_best"] <= 1.3 * fastest  # the planner's first measures (about) the fastest
    assert "measured fastest" in verify_table(rows)


def test_verify_refuses_what_the_runtime_cannot_run():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from plan_fixtures import gpt_profile
    from stagewise.plan.errors import PlanError

    prof = gpt_profile()
    with pytest.raises(PlanError, match="--verify runs the built-in GPT"):
        verify(prof, [], 1, log=None)
