"""Bad input and failing ranks: a clear error naming the rank, every process gone, nothing hangs.

Launches skip the launcher's preflight (``preflight=False``), so the checks run
on the ranks themselves, as under torchrun.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from stagewise import torch_csv
from stagewise.flags import say
from stagewise.runtime import RunConfig
from stagewise.runtime.execution.program import lower
from stagewise.runtime.messages.p2p import ACT, P2P, Route, ShapeError
from stagewise.runtime.launching.launch import RankFailure
from stagewise.runtime.run.train import train_many
from stagewise.runtime.run.models import GPTConfig
from stagewise.schedules import generate
from runtime_helpers import TINY, InsertedLayer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

BASE = RunConfig(schedule="1f1b", ranks=2, microbatches=4, batch=4, steps=2, model=TINY, timeout=30)


def fails(cfg: RunConfig, preflight: bool = False) -> tuple[RankFailure, float]:
    t = time.monotonic()
    with pytest.raises(RankFailure) as info:
        train_many([cfg], preflight=preflight)
    return info.value, time.monotonic() - t


def no_rank_left() -> None:
    import multiprocessing as mp

    assert not [p for p in mp.active_children() if p.name.startswith("stagewise-rank")]


@pytest.mark.parametrize("cfg, needle", [
    (dataclasses.replace(BASE, schedule="interleaved-1f1b", ranks=4, model=GPTConfig(layers_n=2, d_model=32)),
     "the model has 4 layers but the schedule needs 8 stages"),
    (dataclasses.replace(BASE, batch=6), "--batch 6 does not split into --microbatches 4 equal micro-batches"),
    (dataclasses.replace(BASE, split=(4, 3)), "--split 4,3 covers 7 layers; the model has 8, so the split loses"),
], ids=["more stages than layers", "batch not divisible", "split loses a layer"])
def test_bad_options_fail_alike_on_every_rank(cfg, needle):
    err, _ = fails(cfg)
    assert err.user and str(err).startswith("every rank: ") and needle in say(str(err)), say(str(err))
    no_rank_left()


def test_a_placement_needing_more_ranks_than_launched_fails_on_every_rank(tmp_path):
    path = tmp_path / "four.csv"
    torch_csv.dump(generate("1f1b", 4, 4), path)
    err, _ = fails(dataclasses.replace(BASE, schedule=None, csv=str(path), ranks=2))
    assert err.user and str(err).startswith("every rank: ")
    assert "placement needs 4 ranks (stage 3 is on rank 3); 2 were launched" in str(err)
    no_rank_left()


def test_a_shape_change_between_stages_names_the_stage_microbatch_and_both_shapes():
    model = InsertedLayer(**vars(TINY), extra="drop", where=1, at=3)  # stage 0, third forward: micro-batch 2
    err, seconds = fails(dataclasses.replace(BASE, model=model))
    msg = str(err)
    assert err.user and msg.startswith("rank 0: stage 0 micro-batch 2:"), msg
    assert "(1, 15, 32) float32" in msg and "micro-batch 0 had (1, 16, 32) float32" in msg
    assert seconds < 20
    no_rank_left()


def test_the_receiver_checks_every_header_against_the_learned_shape():
    p2p = P2P(lower(generate("1f1b", 2, 4), 1).messages, 1, torch.device("cpu"), 5.0)
    leaf = ((1, 16, 32), torch.float32, True)
    p2p._check(Route(ACT, 1, 0), None, (leaf,), "receives")
    p2p._check(Route(ACT, 1, 1), None, (leaf,), "receives")
    with pytest.raises(ShapeError, match=r"stage 1 micro-batch 2: receives activation \(stage 0 -> 1\) of shape "
                       r"\(1, 16, 32\) float64 with gradient, but micro-batch 0 had \(1, 16, 32\) float32"):
        p2p._check(Route(ACT, 1, 2), None, (((1, 16, 32), torch.float64, True),), "receives")


@pytest.mark.parametrize("how, needle", [
    # the op, from its flight recorder, and the line of the user's code that raised
    ("raise", "rank 1 at 1F0 (step 2): RuntimeError: boom on purpose (at runtime_helpers.py:46 in forward)"),
    ("exit", "rank 1 at 1F0 (step 2): exited with code 3 without a message"),
])
def test_a_failing_rank_stops_all_ranks_at_once(how, needle):
    model = InsertedLayer(**vars(TINY), extra=how, where=7, at=5)  # in stage 1 (rank 1), step 2
    err, seconds = fails(dataclasses.replace(BASE, model=model, timeout=60))
    assert not err.user and str(err) == needle
    assert seconds < 20  # the watchdog, not the 60 s timeout, ended rank 0's wait
    no_rank_left()


def test_a_stalled_peer_times_out_with_the_message_it_waited_for():
    model = InsertedLayer(**vars(TINY), extra="sleep", where=1, at=1)  # stage 0 stalls before its first send
    err, seconds = fails(dataclasses.replace(BASE, model=model, timeout=2))
    assert "rank 1 at 1F0 (step 1): CommTimeout: timed out after 2 s waiting for the activation of micro-batch 0 " \
           "from stage 0 to stage 1 (rank 0); rank 0 stalled at 0F0 (step 1)" in str(err)
    assert seconds < 15
    no_rank_left()
