"""One rank's run of a config (runtime/run/worker.py): the preflight every rank and the launcher run."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

from runtime_helpers import TINY  # noqa: E402

from stagewise.runtime import RunConfig, RunError  # noqa: E402
from stagewise.runtime.run.worker import optimizer_class, preflight  # noqa: E402

BASE = RunConfig(schedule="zb-v", ranks=2, microbatches=4, batch=8, steps=1, model=TINY)


def test_preflight_gives_the_schedule_checked_against_the_model_and_the_ranks():
    sched = preflight(BASE)
    assert (sched.name, sched.ranks, sched.stages) == ("zb-v", 2, 4)
    with pytest.raises(RunError, match="the schedule needs 16 stages per model copy"):
        preflight(dataclasses.replace(BASE, ranks=8, microbatches=8))
    with pytest.raises(RunError, match=r"`recompute` 9: stage 9 is not a stage of the schedule"):
        preflight(dataclasses.replace(BASE, recompute=(9,)))


def test_an_optimizer_is_a_torch_optim_class_that_steps_without_a_closure():
    assert optimizer_class("AdamW").__name__ == "AdamW"
    with pytest.raises(RunError, match="not a torch.optim optimizer"):
        optimizer_class("nope")
    with pytest.raises(RunError, match="LBFGS needs a closure"):
        optimizer_class("lbfgs")
