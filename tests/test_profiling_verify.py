"""`plan --verify` for real: a small built-in GPT on 2 local gloo ranks, predicted vs measured.

Generous tolerances (a shared 2-core machine); benchmarks/bench_plan_fidelity.py has the exact figures.
"""

import pytest

pytest.importorskip("torch")

from stagewise.plan.search.devices import Cluster  # noqa: E402
from stagewise.profiling.measure import profile_model  # noqa: E402
from stagewise.plan.search.profile import Link  # noqa: E402
from stagewise.plan.search.search import Searcher, Space, search  # noqa: E402
from stagewise.profiling.verify import verify, verify_table  # noqa: E402


@pytest.mark.slow
def test_verify_runs_the_top_configurations_and_predicts_them():
    from stagewise.runtime.run.models import GPTConfig

    gpt = GPTConfig(layers_n=2, d_model=256, heads=4, seq=128, vocab=64)
    prof = profile_model(gpt, (2, 4), repeats=3, warmup=1, threads=1)
    link = Link(latency=5e-4, bandwidth=1e9)  # about gloo on loopback here (the profiler can measure it)
    cl = Cluster(devices=2, per_node=2, memory=None, intra=link, inter=link)
    space = Space(families=("1f1b", "zb-h1", "gpipe"), recompute=(False,))
    cands = [c for c in search(Searcher(profile=prof, cluster=cl, global_batch=8, space=space)) if c.config.dp == 1]
    rows = verify(prof, cands, 2, steps=4, rounds=1, log=None)
    assert [r["config"] for r in rows] == [c.config.label() for c in cands[:2]]
    # timings are measured and reported, never compared: how close the prediction comes is
    # benchmarks/bench_plan_fidelity.py's job (a shared machine's load moves any ratio of timed runs)
    for r in rows:
        assert r["measured_best"] > 0 and r["predicted_step"] > 0
        assert r["measured_step"] >= r["measured_best"]  # structural: a median is never below the minimum
        # activation bytes are counted, not timed: the meter's count against the simulator's prediction
        assert all(m is not None and 0.5 < m / p < 2.0 for p, m in zip(r["predicted_activations"],
                                                                         r["measured_activations"]))
    table = verify_table(rows)
    assert "measured fastest" in table and all(r["config"] in table for r in rows)


def test_verify_refuses_what_the_runtime_cannot_run():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from plan_fixtures import gpt_profile
    from stagewise.plan.errors import PlanError

    prof = gpt_profile()
    with pytest.raises(PlanError, match="does not say how to rebuild it"):
        verify(prof, [], 1, log=None)


@pytest.mark.parametrize("meta, words", [
    ({"gpt": {"layers_n": 2, "bogus": 1}}, "meta.gpt does not rebuild the model it was measured on (unexpected keyword "
                                           "argument 'bogus')"),
    ({"gpt": {"layers_n": 2, "d_model": float("nan")}}, "meta.gpt does not rebuild the model it was measured on "
                                                        "(d_model must be a whole number; got nan"),
    ({"gpt": "gpt"}, "meta.gpt does not rebuild the model it was measured on (an object of its options, not str)"),
    ({"hf": {"source": "x", "seq": float("nan")}}, "meta.hf does not rebuild the model it was measured on"),
    ({"gpt": {"layers_n": 2}, "threads": float("nan")}, "meta.threads must be a whole number from 1 to"),
    ({"gpt": {"layers_n": 2}, "optimizer": ["adam"]}, "meta.optimizer must be a torch.optim class name"),
])
def test_a_hand_edited_profile_is_refused_naming_its_field(meta, words):
    """Issue 44: a profile's numbers and options are checked as the profile's (not as flags, not a TypeError)."""
    import dataclasses
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from plan_fixtures import gpt_profile
    from stagewise.plan.errors import PlanError

    prof = dataclasses.replace(gpt_profile(), meta=meta)
    with pytest.raises(PlanError, match="meta") as err:
        verify(prof, [], 1, log=None)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
