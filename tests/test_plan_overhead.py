"""The per-step work outside the layers: its fit, and the planner adding it to every prediction."""

import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stagewise.plan.search import Cluster
from stagewise.plan.search import KEY, fit_overhead, fit_slowdown, step_overhead
from stagewise.plan.search import Profile
from stagewise.plan.search import Searcher, Space, search

sys.path.insert(0, str(Path(__file__).parent))
from plan_fixtures import gpt_profile  # noqa: E402


def test_fit_is_fixed_plus_per_action():
    fit = fit_overhead([(4, 0.010 + 4 * 0.002), (16, 0.010 + 16 * 0.002)])
    assert fit["fixed_s"] == pytest.approx(0.010) and fit["per_action_s"] == pytest.approx(0.002)
    flat = fit_overhead([(4, 0.03), (16, 0.01)])  # a residual that falls with more actions: no negative terms
    assert flat["per_action_s"] == 0.0 and flat["fixed_s"] == pytest.approx(0.02)
    origin = fit_overhead([(4, -0.004), (8, 0.004)])  # the line would start below zero: through the origin
    assert origin["fixed_s"] == 0.0 and origin["per_action_s"] == pytest.approx((8 * 0.004 - 4 * 0.004) / 80)


def test_plan_adds_the_measured_overhead():
    prof = gpt_profile(blocks=8)
    cl = Cluster(devices=2, per_node=2, memory=None, intra=prof.link, inter=prof.link)
    space = Space(families=("1f1b",), recompute=(False,), micro_batch_sizes=(1,))
    plain = search(Searcher(profile=prof, cluster=cl, global_batch=8, space=space))
    fit = {"fixed_s": 0.5, "per_action_s": 0.25, "samples": []}
    timed = search(Searcher(profile=replace(prof, meta={KEY: fit}), cluster=cl, global_batch=8, space=space))
    for a, b in zip(plain, timed):
        ops = max(len(p) for p in b.schedule.programs)
        assert b.overhead == step_overhead(replace(prof, meta={KEY: fit}), ops) == 0.5 + 0.25 * ops
        assert b.step_time == pytest.approx(a.step_time + b.overhead)
    back = Profile.loads(__import__("json").dumps(replace(prof, meta={KEY: fit}).to_json()))
    assert back.meta[KEY]["per_action_s"] == 0.25  # the profile file keeps the fit


def test_fit_slowdown_is_measured_over_predicted_op_seconds():
    assert fit_slowdown([(0.10, 0.11), (0.30, 0.33)]) == pytest.approx(0.10)
    assert fit_slowdown([(0.10, 0.09)]) == 0.0  # faster than profiled: nothing added, never a discount
    assert fit_slowdown([(0.10, None)]) == 0.0  # no measured timeline: no claim


def test_plan_stretches_each_configuration_by_the_measured_slowdown():
    """The slowdown scales with each configuration's own makespan, so it can reorder configurations."""
    prof = gpt_profile(blocks=8)
    cl = Cluster(devices=2, per_node=2, memory=None, intra=prof.link, inter=prof.link)
    space = Space(recompute=(False,), micro_batch_sizes=(1,))
    plain = {c.config: c for c in search(Searcher(profile=prof, cluster=cl, global_batch=8, space=space))}
    only = replace(prof, meta={KEY: {"slowdown": 0.2}})  # a file of another version: the missing terms are 0
    timed = search(Searcher(profile=only, cluster=cl, global_batch=8, space=space))
    assert len(timed) == len(plain) and {c.makespan for c in timed} != {timed[0].makespan}
    for b in timed:
        a = plain[b.config]
        assert b.overhead == pytest.approx(0.2 * a.makespan)
        assert b.step_time == pytest.approx(a.makespan * 1.2 + a.allreduce + a.optimizer)
    assert step_overhead(replace(prof, meta={KEY: {"fixed_s": 0.1, "per_action_s": 0.0}}), 9, 5.0) == 0.1
