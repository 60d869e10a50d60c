"""`--save-on-signal`: a stop notice (SIGTERM) finishes the step, saves it within the grace, exits 143; the
checkpoint resumes bit for bit; a second notice stops at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from cli_helpers import fails, run
from conftest import ELASTIC_RUN, elastic_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
pytest.importorskip("torch")


def test_a_notice_during_step_5_saves_step_5_which_resumes_bit_for_bit(capsys, tmp_path, monkeypatch,
                                                                      uninterrupted_elastic_run):
    from stagewise.runtime import train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAGEWISE_FAULT", "term:rank=1:action=1F0:step=5")  # the notice reaches rank 1 alone
    rc, out, err = run(capsys, "train", *ELASTIC_RUN, "--steps", "7", "--save", "ck", "--save-on-signal", "20")
    assert rc == 143, err
    assert "stopped by SIGTERM after step 5: saved ck/step-00000005; resume with --resume ck" in err
    assert "step 5/7" in out and "step 6/7" not in out  # every rank agreed to stop after the step in flight
    assert sorted(os.listdir("ck")) == ["step-00000005"] and (tmp_path / "ck/step-00000005/manifest.json").exists()
    monkeypatch.delenv("STAGEWISE_FAULT")
    resumed = train(elastic_config(resume=str(tmp_path / "ck")))
    assert resumed.checkpoint["rng_restored"]
    assert resumed.losses == uninterrupted_elastic_run.losses[5:]  # bit for bit


def _notices_after(monkeypatch, step: int, count: int) -> None:
    """Send this process (the launcher, run in-process) ``count`` SIGTERMs once step ``step`` is reported."""
    import stagewise.cli.train as train_cli

    report = train_cli._progress.report

    def send():
        time.sleep(0.3)  # into the next step
        for _ in range(count):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # two signals at once would be one (the kernel does not queue them)

    def reported(self, job, k, loss, seconds):
        report(self, job, k, loss, seconds)
        if k + 1 == step:
            threading.Thread(target=send, daemon=True).start()

    monkeypatch.setattr(train_cli._progress, "report", reported)


TINY = ["--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "2", "--d-model", "32", "--seq", "16", "--no-memory",
        "--save", "ck", "--save-on-signal"]


def test_sigterm_to_the_command_reaches_every_rank_which_save_the_step_in_flight(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _notices_after(monkeypatch, 1, 1)
    rc, out, err = run(capsys, "train", *TINY, "30", "--steps", "100000")
    assert rc == 143, err
    saved = err.split("saved ")[1].split(";")[0]
    assert (tmp_path / saved / "manifest.json").exists()  # complete: the manifest is written last


def test_the_grace_bounds_a_step_that_never_ends_and_a_second_sigterm_stops_at_once(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STAGEWISE_FAULT", "hang:rank=1:action=1F0:step=2")  # step 2 never ends
    for count, grace in ((1, "2"), (2, "60")):
        (tmp_path / str(count)).mkdir()
        monkeypatch.chdir(tmp_path / str(count))
        _notices_after(monkeypatch, 1, count)
        start = time.monotonic()
        rc, out, err = run(capsys, "train", *TINY, grace, "--steps", "3", "--timeout", "60")
        assert rc == 143 and "stopped by SIGTERM; every rank stopped" in err, err
        assert time.monotonic() - start < 20  # neither the hour of the hang nor the --timeout
        assert not list(Path("ck").glob("*/manifest.json"))  # no step finished after the notice: none saved
        monkeypatch.undo()
        monkeypatch.setenv("STAGEWISE_FAULT", "hang:rank=1:action=1F0:step=2")


def test_save_on_signal_needs_save_and_a_grace(capsys):
    assert "--save-on-signal writes a checkpoint" in fails(capsys, "train", *ELASTIC_RUN, "--save-on-signal")
    assert "the grace must be a number of seconds > 0" in fails(capsys, "train", *ELASTIC_RUN, "--save", "x",
                                                                "--save-on-signal", "0")
