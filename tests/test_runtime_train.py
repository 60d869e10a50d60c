"""Where a config-driven run's ranks come from (runtime/run/train.py)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

from runtime_helpers import TINY  # noqa: E402

from stagewise.runtime import RunConfig, RunError, RunResult, train, train_many  # noqa: E402

BASE = RunConfig(schedule=None, ranks=1, steps=1, batch=4, model=TINY)


def test_the_unpipelined_reference_runs_in_this_process():
    res = train(BASE)
    assert isinstance(res, RunResult) and res.schedule == "none" and len(res.losses) == 1


def test_one_launch_runs_one_number_of_ranks():
    with pytest.raises(RunError, match=r"one launch runs one number of ranks; got \[2, 4\]"):
        train_many([dataclasses.replace(BASE, schedule="1f1b", ranks=2, microbatches=2),
                    dataclasses.replace(BASE, schedule="1f1b", ranks=4, microbatches=4)])
    with pytest.raises(RunError, match="train_many runs pipelined configs only"):
        train_many([BASE, BASE])
