"""Activation recomputation: the same gradients, with dropout too, for less memory.

In this process (p = 1, several stages on one rank, no process group): every
backward kind (B, I + W) and a V-shape with two stages on the rank, with and
without dropout, compared bitwise with the run that keeps its activations;
a replay that forgets the RNG state is caught. On real gloo ranks (one launch):
recomputation on every stage and on chosen stages equals the unpipelined
reference and lowers the measured peak.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from cli_helpers import raises_said
from runtime_helpers import TINY, rel_err
from scale_helpers import SMALL, DropoutGPT, run_local

from stagewise.runtime import RunConfig, RunError
from stagewise.runtime.run.train import train, train_many
from stagewise.runtime.execution.recompute import Recompute, recompute_stages
from stagewise.schedules import generate

DROPOUT = DropoutGPT(layers_n=2, d_model=32, heads=4, seq=16, vocab=64)
LOCAL = [("gpipe", None), ("zb-h1", None), ("interleaved-1f1b", 2), ("zb-v", None)]


@pytest.mark.parametrize("name, v", LOCAL, ids=[n for n, _ in LOCAL])
@pytest.mark.parametrize("model", [SMALL, DROPOUT], ids=["plain", "dropout"])
def test_recomputing_every_stage_gives_the_same_loss_and_gradients_bitwise(name, v, model):
    sched = generate(name, 1, 4, v)
    kept, meter_kept, loss_kept = run_local(sched, model)
    redone, meter_redone, loss_redone = run_local(sched, model, recompute=range(sched.stages))
    assert loss_redone == loss_kept
    assert kept.keys() == redone.keys()
    for key in kept:
        assert torch.equal(kept[key], redone[key]), key
    assert set(meter_redone.added["R"]) == set(range(sched.stages))  # every stage replayed its forward
    assert meter_kept.added["R"] == {}


def test_a_replay_that_forgets_the_rng_state_gives_other_gradients(monkeypatch):
    sched = generate("gpipe", 1, 4)
    kept, _, _ = run_local(sched, DROPOUT)
    monkeypatch.setattr(Recompute, "replaying", lambda self, state: nullcontext())
    wrong, _, _ = run_local(sched, DROPOUT, recompute={0})
    assert any(not torch.equal(kept[k], wrong[k]) for k in kept)  # the masks differ: the test above can fail


def test_recomputation_keeps_only_the_stage_input_between_f_and_the_backward():
    sched = generate("gpipe", 1, 4, None)  # all four forwards are held before the first backward
    _, kept, _ = run_local(sched, SMALL)
    _, redone, _ = run_local(sched, SMALL, recompute={0})
    tokens = 2 * SMALL.seq * 8  # a micro-batch of 2 sequences of int64 token ids
    assert redone.added["F"] == {0: tokens}
    assert redone.peak == 4 * tokens + redone.added["R"][0]  # four inputs, and one forward replayed at a time
    assert kept.peak == 4 * kept.added["F"][0] > 3 * redone.peak
    assert kept.count.live == redone.count.live == 0  # nothing outlives the step


def test_recompute_stages_are_checked_against_the_schedule():
    assert recompute_stages(True, 3) == {0, 1, 2} and recompute_stages(False, 3) == set()
    assert recompute_stages((0, 2), 4) == {0, 2}
    with raises_said(RunError, r"--recompute/--recompute-stages 1,4: stage 4 is not a stage of the schedule "
                               r"\(it has stages 0..3\)"):
        recompute_stages((1, 4), 4)
    with raises_said(RunError, "--recompute/--recompute-stages needs a --schedule run on ranks"):
        RunConfig(schedule=None, ranks=1, recompute=True).check()


BASE = RunConfig(schedule=None, ranks=1, microbatches=4, batch=8, steps=2, model=TINY, collect=("grads",),
                 timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_recomputation_on_real_ranks_equals_the_reference_and_lowers_the_peak():
    ref = train(BASE)
    cfgs = [dataclasses.replace(BASE, schedule=name, ranks=2, recompute=rc) for name, rc in (
        ("1f1b", False), ("1f1b", True), ("zb-h1", (0,)), ("dualpipe", True))]
    results = train_many(cfgs)
    for cfg, res in zip(cfgs, results):
        np.testing.assert_allclose(res.losses, ref.losses, rtol=1e-5, err_msg=cfg.schedule)
        for name, copies in res.grads.items():
            assert max(rel_err(g, ref.grads[name][0]) for g in copies) <= 1e-5, (cfg.schedule, name)
    plain, redone = results[0], results[1]
    assert redone.recompute == (0, 1) and results[2].recompute == (0,)
    # rank 0 holds two micro-batches at its peak, the last rank one: recomputation keeps two inputs and one
    # replayed forward instead of two forwards, and gains nothing where only one is in flight
    before, after = plain.memory.peak_activation_bytes, redone.memory.peak_activation_bytes
    assert after[0] < 0.6 * before[0] and after[1] <= before[1]
    assert after == pytest.approx(redone.memory.predicted_peak_activation_bytes, rel=1e-9)
