"""`--save-on-signal`: a stop notice (SIGTERM) finishes the step, saves it within the grace, exits 143; the
checkpoint resumes bit for bit; a second notice stops at once."""

from __future__ import annotations

import os
import signal
import subprocess
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

    # resumed in a fresh torchrun launch where only 2 ranks are free: --elastic re-plans as a restart does (the
    # global batch kept) and says so; a notice there saves step 6, said once (rank 0), every worker exits 143
    fresh = _fresh_torchrun_launch(tmp_path, *ELASTIC_RUN, "--steps", "7", "--resume", "ck", "--save", "ck",
                                   "--save-on-signal", "20", "--elastic", "2:4")
    assert fresh.stderr.count("stagewise: launched on 2 ranks, the layout configured needs 4: resuming from ck "
                              "(step 5); re-planned pp 2 x dp 2, m 2 -> pp 2, m 4 (dropped 1 of 2 dp replicas") == 1, \
        fresh.stderr[-3000:]
    [line] = [x for x in fresh.stdout.splitlines() if x.startswith("step ")]
    assert line.startswith("step 6/7  loss ")
    assert abs(float(line.split()[3]) - uninterrupted_elastic_run.losses[5]) < 1.5e-4  # to the 4 decimals shown
    assert fresh.stderr.count("stagewise train: stopped by SIGTERM after step 6: saved ck/step-00000006; resume "
                              "with --resume ck") == 1
    assert fresh.stderr.count("exitcode  : 143") == 2 and (tmp_path / "ck/step-00000006/manifest.json").exists()


def _fresh_torchrun_launch(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc-per-node 2 -m stagewise train ARGS` in ``tmp_path``, a notice (SIGTERM) to
    its rank 1 in step 6."""
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun not installed")
    return subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "stagewise", "train", *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "STAGEWISE_FAULT": "term:rank=1:action=1F0:step=6"})


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
