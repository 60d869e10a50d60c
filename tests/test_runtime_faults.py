"""Faults never hang: a rank that dies, raises, stalls or produces a NaN loss ends the run, fast, naming it.

The injected faults (stagewise.runtime.resilience.faults) fire when the chosen rank
starts the chosen op. Elapsed times are measured from the moment the faulty
step began (the progress report of the step before it), so they bound the
detection, not the start of the processes.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stagewise.actions import Action
from stagewise.cli import main
from stagewise.flags import say
from stagewise.runtime import RunConfig, RunError
from stagewise.runtime.resilience import flight
from stagewise.runtime.resilience.faults import Fault, parse_fault
from stagewise.runtime.launching.launch import RankFailure
from stagewise.runtime.run.train import train, train_many
from runtime_helpers import TINY

pytestmark = [pytest.mark.timeout(120)]

BASE = RunConfig(schedule="1f1b", ranks=2, microbatches=4, batch=4, steps=3, model=TINY, timeout=30)
BOUND_S = 10.0  # detection to every rank gone: the watchdog needs ~0.6 s; slack for a loaded 2-core machine


def no_rank_left() -> None:
    assert not [p for p in mp.active_children() if p.name.startswith("stagewise-rank")]


def fails(cfg: RunConfig) -> tuple[RankFailure, float]:
    """The failure of ``cfg`` and the seconds from the start of its step 2 to the launcher's error."""
    marks = {}
    t = time.monotonic()
    with pytest.raises(RankFailure) as info:
        train_many([cfg], lambda job, step, *_: marks.setdefault(step, time.monotonic()))
    return info.value, time.monotonic() - marks.get(0, t)


# ---- the hook and the recorder, without processes

def test_fault_text_parses_and_bad_text_names_the_rule():
    assert parse_fault("exit:rank=1:action=1F3:step=2") == Fault(how="exit", rank=1, action=Action("F", 1, 3), step=2)
    assert parse_fault("nan:action=3F0:rank=1").step == 1
    assert parse_fault("lose:rank=3:action=1F0:step=3:back=5").back == 5  # the slot returns after step 5
    for text, needle in [("boom:rank=1:action=1F0", "'boom' is not one of exit, raise, hang, nan"),
                         ("exit:rank=1", "needs rank= and action="), ("exit:rank=x:action=1F0", "invalid literal"),
                         ("exit:rank=1:action=1Q0", "not an action"), ("exit:rank=1:action=1F0:when=2", "bad field"),
                         ("exit:rank=1:action=1F0:back=2", "needs HOW lose"),
                         ("lose:rank=1:action=1F0:step=3:back=2", "J >= step")]:
        with pytest.raises(RunError, match=needle):
            parse_fault(text)


def test_a_fault_fires_once_per_run_not_in_a_restarted_torchrun_worker(monkeypatch):
    from stagewise.runtime.resilience.faults import injector_for

    assert parse_fault("lose:rank=3:action=1F0:step=3").how == "lose" and parse_fault("term:rank=0:action=0F0")
    assert injector_for("lose:rank=3:action=1F0:step=3", 3).fault.rank == 3
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun's --max-restarts started this worker again
    assert injector_for("lose:rank=3:action=1F0:step=3", 3) is None


def test_a_fault_must_name_an_action_of_its_rank_before_any_rank_starts():
    with pytest.raises(RunError, match=r"rank 0 of 1f1b \(p=2, 2 ranks\) does not run 1F0"):
        train(dataclasses.replace(BASE, fault="exit:rank=0:action=1F0"))
    with pytest.raises(RunError, match="a nan fault poisons the loss, so it needs the F of a lane's last stage"):
        train(dataclasses.replace(BASE, fault="nan:rank=0:action=0F0"))


@given(capacity=st.integers(1, 9), n=st.integers(0, 30))
def test_the_ring_keeps_the_last_events_in_order_and_a_second_recorder_continues_it(tmp_path_factory, capacity, n):
    path = tmp_path_factory.mktemp("ring") / "r.flight"
    rec = flight.Recorder(capacity=capacity, path=path)
    for i in range(n):
        rec.event(flight.SEND, f"e{i}")
    again = flight.Recorder(capacity=capacity, path=path)  # the next job of the same rank
    again.event(flight.SEND, f"e{n}")
    texts = [e.text for e in flight.read(path)]
    assert texts == [f"e{i}" for i in range(n + 1)][-capacity:]
    assert [e.text for e in again.entries()] == texts


def test_where_a_rank_stopped():
    rec = flight.Recorder()
    assert flight.where(rec.entries()) == ""
    rec.step(1)
    rec.start("1F3")
    assert flight.where(rec.entries()) == "at 1F3 (step 2)"
    rec.event(flight.WAIT, "activation mb 3, stage 0->1 (rank 0)")
    assert flight.where(rec.entries()) == "at 1F3 (step 2), waiting for the activation mb 3, stage 0->1 (rank 0)"
    assert flight.where(rec.entries(), waits=False) == "at 1F3 (step 2)"
    rec.event(flight.GOT, "activation mb 3, stage 0->1 (rank 0)")
    rec.end("1F3")
    rec.event(flight.SYNC, "gradients and loss")
    assert flight.where(rec.entries()) == "in the step-end collectives of step 2"


def test_a_rank_that_dies_after_its_result_still_fails_the_local_launch():
    from stagewise.runtime.launching.launch import _reap

    class Exited:  # a rank process that has exited with ``exitcode``
        def __init__(self, exitcode):
            self.exitcode = exitcode

        def join(self, timeout=None):
            pass

    _reap([Exited(0), Exited(0)])
    with pytest.raises(RankFailure, match=r"^rank 1: exited with code -6 \(SIGABRT\) after reporting its result$"):
        _reap([Exited(0), Exited(-6)])


# ---- real ranks

@pytest.mark.slow
@pytest.mark.parametrize("how, needle", [
    ("exit", "rank 1 at 1F2 (step 2): exited with code 3 without a message"),
    ("raise", "rank 1 at 1F2 (step 2): InjectedFault: injected on purpose at 1F2 (step 2)"),
])
def test_a_rank_that_dies_or_raises_mid_step_ends_every_rank_at_once(how, needle):
    err, seconds = fails(dataclasses.replace(BASE, fault=f"{how}:rank=1:action=1F2:step=2"))
    assert not err.user and str(err) == needle and err.ranks == (1,)
    assert seconds < BOUND_S, seconds  # the 30 s --timeout played no part
    no_rank_left()
    lines = err.flight.splitlines()
    mine = lines.index("flight recorder, rank 1 (failed): last 12 events")
    assert lines[mine + 12].split()[-2:] == ["start", "1F2"]  # its last event: the op it died at
    assert "flight recorder, rank 0: last 6 events" in lines  # the survivor's last events too


@pytest.mark.slow
def test_a_dead_rank_among_data_parallel_replicas_is_named_by_its_global_rank():
    cfg = dataclasses.replace(BASE, dp=2, batch=8, fault="exit:rank=3:action=1B1:step=2")
    err, seconds = fails(cfg)
    assert str(err) == "rank 3 at 1B1 (step 2): exited with code 3 without a message" and seconds < BOUND_S
    assert all(f"flight recorder, rank {r}" in err.flight for r in range(4))
    no_rank_left()


@pytest.mark.slow
def test_a_stalled_rank_is_named_after_the_timeout():
    err, seconds = fails(dataclasses.replace(BASE, timeout=1, fault="hang:rank=1:action=1B0"))
    assert str(err) == ("rank 0 at 0B0 (step 1): CommTimeout: timed out after 1 s waiting for the gradient of "
                        "micro-batch 0 from stage 1 to stage 0 (rank 1); rank 1 stalled at 1B0 (step 1)")
    assert seconds < 1 + BOUND_S
    no_rank_left()


@pytest.mark.slow
def test_a_nan_loss_stops_the_run_naming_step_microbatch_stage_and_rank():
    err, _ = fails(dataclasses.replace(BASE, fault="nan:rank=1:action=1F3:step=2"))
    assert say(str(err)) == ("every rank: NonFiniteLoss: step 2: the loss is nan at micro-batch 3 (stage 1, rank 1); "
                             "stopped (to skip such a step's update and go on instead: --skip-nonfinite)")
    no_rank_left()


@pytest.mark.slow
def test_skip_nonfinite_skips_that_update_on_every_rank_and_goes_on():
    one_step = dataclasses.replace(BASE, steps=1, collect=("params",))
    skipped = dataclasses.replace(BASE, steps=2, collect=("params",), skip_nonfinite=True,
                                  fault="nan:rank=1:action=1F0:step=2")
    ref, res = train_many([one_step, skipped])
    assert res.losses[0] == ref.losses[0] and np.isnan(res.losses[1])
    (skip,) = res.skipped_steps
    assert skip["step"] == 2 and np.isnan(skip["loss"]) and skip["where"] == "micro-batch 0 (stage 1, rank 1)"
    for name, copies in res.params.items():  # every copy on every rank: still the weights after step 1
        for c in copies:
            assert np.array_equal(c, ref.params[name][0]), name


@pytest.mark.slow
def test_the_command_line_exits_non_zero_with_the_rank_its_op_and_the_flight_records(capsys, monkeypatch):
    monkeypatch.setenv("STAGEWISE_FAULT", "raise:rank=0:action=0B1:step=2")
    try:
        rc = main(["train", "--schedule", "1f1b", "-p", "2", "-m", "4", "--layers", "2", "--d-model", "32",
                   "--seq", "16", "--steps", "3"])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert rc == 1 and out.startswith("step 1/3  loss ") and "step 2/3" not in out
    assert lines[0] == ("stagewise train: error: rank 0 at 0B1 (step 2): InjectedFault: injected on purpose at "
                        "0B1 (step 2)")
    assert lines[1] == "flight recorder, rank 0 (failed): last 12 events" and "Traceback" not in err
    no_rank_left()
