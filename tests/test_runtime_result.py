"""RunResult: the typed value a run returns, and its JSON (the one place `train --json` keys are written)."""

from __future__ import annotations

import dataclasses

import pytest

from stagewise import Parallelism
from stagewise.runtime.result import Memory, RunResult, merge_copies

BASE = RunResult(schedule="1f1b", ranks=2, microbatches=4, losses=(4.0, 3.5), step_time_s=(0.2, 0.1),
                 measured_bubble_fraction=0.3, predicted_bubble_fraction=0.25)


def test_the_reference_json_has_no_sections():
    assert BASE.to_json() == {"schedule": "1f1b", "ranks": 2, "microbatches": 4, "losses": [4.0, 3.5],
                              "step_time_s": [0.2, 0.1], "measured_bubble_fraction": 0.3,
                              "predicted_bubble_fraction": 0.25}


def test_sections_appear_when_the_run_has_them():
    mem = Memory(stage_activation_bytes={}, peak_activation_bytes=(10.0, 8.0),
                 predicted_peak_activation_bytes=(11.0, 8.0))
    res = dataclasses.replace(BASE, parallelism=Parallelism(pp=2), recompute=(0,), memory=mem, checkpoint={"saved": ["a"]},
                              skipped_steps=({"step": 2, "loss": float("nan"), "where": ""},))
    out = res.to_json()
    assert (out["dp"], out["recompute"]) == (1, [0])
    assert out["parallelism"] == {**Parallelism(pp=2).to_dict(), "world": 2, "data_shards": 1}
    assert out["peak_activation_bytes"] == [10.0, 8.0] and out["peak_memory_allocated_bytes"] is None
    assert out["checkpoint"] == {"saved": ["a"]} and out["skipped_steps"][0]["step"] == 2
    assert "grads" not in out and "timelines" not in out  # arrays and timelines stay out of the JSON


def test_frozen_and_copies_merge_in_rank_order():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.losses = ()
    merged = merge_copies([{"w": [1]}, None, {"w": [2], "b": [3]}])
    assert merged == {"w": [1, 2], "b": [3]} and merge_copies([None, None]) is None
    assert BASE.with_copies(merged, None).grads == merged and BASE.last_timeline is None


def test_a_run_that_starts_after_step_0_numbers_its_losses():
    resumed = dataclasses.replace(BASE, first_step=5)
    assert resumed.steps == [6, 7] and resumed.to_json()["steps"] == [6, 7]
    assert BASE.steps == [1, 2] and "steps" not in BASE.to_json()  # from step 1: the list's order says it


def test_tokens_padding_and_rate_come_from_the_steps_counted():
    res = dataclasses.replace(BASE, tokens=(300, 200), token_places=(400, 400))
    out = res.to_json()
    assert out["tokens"] == 500 and out["padding_fraction"] == pytest.approx(0.375)
    assert out["tokens_per_s"] == pytest.approx(200 / 0.1)  # after the first step, which warms up
    one = dataclasses.replace(BASE, losses=(4.0,), step_time_s=(0.5,), tokens=(100,), token_places=(100,))
    assert one.tokens_per_s == pytest.approx(200.0) and one.padding_fraction == 0.0
    partial = dataclasses.replace(res, tokens=(300,), token_places=(400,))  # a restarted run's last attempt only
    assert "tokens" not in partial.to_json()
