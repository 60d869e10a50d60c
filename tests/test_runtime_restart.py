"""`train --max-restarts N --elastic MIN:MAX`: a rank's death restarts every rank from the last complete
checkpoint; with a slot gone the layout is re-planned for the ranks left, the global batch kept, and the loss
curve goes on as a run resumed there at that layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import fails, run
from conftest import ELASTIC_RUN, LOSE_RANK_3, SHRINK, elastic_config, shrunk

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
pytest.importorskip("torch")


def test_pp2_dp2_losing_a_slot_at_step_3_finishes_at_pp2_with_the_same_global_batch(capsys, tmp_path, monkeypatch,
                                                                                    uninterrupted_elastic_run):
    from stagewise import Parallelism
    from stagewise.runtime import train
    from stagewise.runtime.run import restart

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAGEWISE_FAULT", LOSE_RANK_3)  # rank 3 dies at step 3; its slot stays gone
    rc, out, err = run(capsys, "train", *ELASTIC_RUN, "--steps", "5", *SHRINK)
    assert rc == 0, err
    res = shrunk(out, err)
    full = uninterrupted_elastic_run.losses
    assert res["losses"][:2] == list(full[:2])  # before the restart: the uninterrupted run's
    monkeypatch.delenv("STAGEWISE_FAULT")
    there = train(elastic_config(parallelism=Parallelism(pp=2), microbatches=4, steps=5,
                                 resume=str(tmp_path / "ck/step-00000002")))
    assert res["losses"][2:] == list(there.losses)  # from it: a run resumed there at the new layout
    assert max(abs(a - b) for a, b in zip(res["losses"], full)) < 1e-5  # the curve goes on

    # a restart resumes only a complete checkpoint that this launch wrote
    cfg = elastic_config(save=str(tmp_path / "ck"))
    assert restart._resume_point(cfg, {}).endswith("step-00000005")
    (tmp_path / "ck/step-00000005/manifest.json").unlink()  # half-written
    assert restart._resume_point(cfg, {}).endswith("step-00000004")
    assert restart._resume_point(cfg, restart._complete(cfg.save)) is None  # all there before: another run's


def test_a_lost_slot_that_comes_back_grows_the_run_back_at_its_next_checkpoint(capsys, tmp_path, monkeypatch,
                                                                               uninterrupted_elastic_run):
    from stagewise import Parallelism
    from stagewise.runtime import train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAGEWISE_FAULT", "lose:rank=3:action=1F0:step=3:back=3")  # gone at step 3, back after it
    rc, out, err = run(capsys, "train", *ELASTIC_RUN, "--steps", "7", "--save", "ck", "--save-every", "2",
                       "--max-restarts", "1", "--elastic", "2:4", "--json")
    assert rc == 0, err
    res = json.loads(out)
    shrink, grow = res["restarts"]  # a grow is no failure: one restart allowed, two transitions
    assert (shrink["event"], shrink["new_layout"]["text"]) == ("failure", "pp 2, m 4")
    assert (grow["event"], grow["after_step"], grow["slots_back"], grow["resumed_step"], grow["lost_steps"]) == \
        ("grow", 4, 1, 4, 0)  # back after step 3; the next checkpoint is step 4's
    assert (grow["old_layout"]["text"], grow["new_layout"]["text"]) == ("pp 2, m 4", "pp 2 x dp 2, m 2")
    assert grow["replan"] == "the layout as configured" and grow["downtime_s"] >= 0
    assert "grow 2: 1 rank slot back; stopped at the checkpoint after step 4; restarting from ck/step-00000004" in err
    assert (res["ranks"], res["dp"], res["microbatches"], len(res["losses"])) == (2, 2, 2, 7)
    full = uninterrupted_elastic_run.losses
    assert res["losses"][:2] == list(full[:2])
    monkeypatch.delenv("STAGEWISE_FAULT")
    grown = train(elastic_config(steps=7, resume=str(tmp_path / "ck/step-00000004")))
    assert res["losses"][4:] == list(grown.losses)  # from the grow: a run resumed there at the layout as configured
    assert max(abs(a - b) for a, b in zip(res["losses"], full)) < 1e-5  # the curve goes on through both


def test_a_run_that_cannot_go_on_with_the_ranks_left_stops_naming_why(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAGEWISE_FAULT", "lose:rank=1:action=1F0:step=2")
    two = ["--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "2", "--d-model", "32", "--seq", "16", "--no-memory",
           "--steps", "3", "--max-restarts", "1"]
    rc, out, err = run(capsys, "train", *two)
    assert rc == 1 and ("cannot restart: 1 rank slot gone: 1 rank left, and the layout pp 2 needs 2; give --elastic "
                        "MIN:MAX to re-plan for the ranks left") in err, err


def test_restart_options_are_checked_before_any_rank_starts(capsys):
    assert "--elastic 2:4 re-plans" in fails(capsys, "train", *ELASTIC_RUN, "--elastic", "2:4")
    assert "outside MIN:MAX" in fails(capsys, "train", *ELASTIC_RUN, "--max-restarts", "1", "--elastic", "1:2")
    assert "MIN:MAX ranks" in fails(capsys, "train", *ELASTIC_RUN, "--elastic", "3")
    assert "whole number >= 0" in fails(capsys, "train", *ELASTIC_RUN, "--max-restarts", "-1")


def test_pp2_fsdp2_losing_a_slot_keeps_fsdp_and_goes_on_one_stage(capsys, tmp_path, monkeypatch,
                                                                  uninterrupted_elastic_run):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STAGEWISE_FAULT", "lose:rank=2:action=0F0:step=2")
    fsdp = [a if a != "--dp" else "--fsdp" for a in ELASTIC_RUN]
    rc, out, err = run(capsys, "train", *fsdp, "--steps", "3", "--save", "ck", "--max-restarts", "1", "--elastic",
                       "2:4", "--json")
    assert rc == 0, err
    res = json.loads(out)
    [r] = res["restarts"]
    assert r["new_layout"]["text"] == "pp 1 x fsdp 2, m 2" and "2 -> 1 stages" in r["replan"]
    assert r["resumed_from"] is None and "from step 0 (no checkpoint of this run yet)" in err  # none saved yet
    assert len(res["losses"]) == 3  # the same sequences: the uninterrupted curve, to DCP's and FSDP's rounding
    assert max(abs(a - b) for a, b in zip(res["losses"], uninterrupted_elastic_run.losses)) < 1e-5



@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(), reason="torchrun not installed")
def test_under_torchrun_max_restarts_each_worker_resumes_the_last_complete_checkpoint(tmp_path,
                                                                                   uninterrupted_elastic_run):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "-m", "stagewise",
                           "train", "--schedule", "1f1b",
                           "-m", "4", "--layers", "2", "--d-model", "32", "--seq", "16", "--no-memory", "--steps", "4",
                           "--save", "ck", "--save-every", "2", "--json"], capture_output=True, text=True, timeout=170,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1",
                                             "STAGEWISE_FAULT": "exit:rank=1:action=1F0:step=3"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)  # the restarted attempt's: from the checkpoint after step 2 on
    assert res["checkpoint"]["resumed_from"].endswith("ck/step-00000002")
    assert max(abs(a - b) for a, b in zip(res["losses"], uninterrupted_elastic_run.losses[2:4])) < 1e-5
    assert res["steps"] == [3, 4]  # the steps this attempt ran, numbered
    [r] = res["restarts"]  # with what the restarted worker measured of its way back
    assert all(r[k] >= 0 for k in ("start_s", "replan_s", "load_s", "reshard_s", "first_step_s"))
    assert r["started_at"] + r["start_s"] <= r["first_step_at"]


@pytest.mark.skipif(not (Path(sys.executable).parent / "torchrun").exists(), reason="torchrun not installed")
def test_under_torchrun_a_node_gone_re_plans_for_the_ranks_the_rendezvous_brings(tmp_path, uninterrupted_elastic_run):
    """Two torchrun agents (a node each, 2 ranks each) meet in one c10d rendezvous (--nnodes 1:2); every rank
    stalls in step 3 (a hang fault on rank 0) until the test kills agent B's whole node; A's workers fail,
    torchrun restarts them on the 2 ranks left, and each re-plans pp 2 x dp 2 -> pp 2 and resumes step 2."""
    import signal
    import socket
    import time

    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "STAGEWISE_FAULT": "hang:rank=0:action=0F0:step=3"}
    agents = []
    for host in ("true", "false"):  # A hosts the rendezvous' store, so B's death leaves it
        cmd = [torchrun, "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "shrink",
               "--rdzv-conf", f"is_host={host},last_call_timeout=2,join_timeout=120", "-m", "stagewise", "train",
               *ELASTIC_RUN, "--steps", "5", "--save", "ck", "--save-every", "2", "--max-restarts", "1",
               "--elastic", "2:4", "--timeout", "8", "--json"]
        agents.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True))
        time.sleep(1)
    a, b = agents
    try:
        saved = tmp_path / "ck/step-00000002/manifest.json"  # steps 1 and 2 done, 3 stalled
        for _ in range(1500):  # a hang bound of 150 s
            if saved.exists() or a.poll() is not None:
                break
            time.sleep(0.1)
        assert saved.exists(), "no checkpoint of step 2"
        os.killpg(b.pid, signal.SIGKILL)  # node B is gone for good
        out, err = a.communicate(timeout=150)
    finally:
        for p in agents:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert a.returncode == 0, err[-3000:]
    res = json.loads(out)
    [r] = res["restarts"]
    assert (r["event"], r["resumed_step"], r["world"]) == ("torchrun restart", 2, 2)
    assert (r["old_layout"]["text"], r["new_layout"]["text"]) == ("pp 2 x dp 2, m 2", "pp 2, m 4")
    assert "torchrun restart 1 on 2 ranks: resuming from ck/step-00000002 (step 2); re-planned" in err
    assert (res["ranks"], res["dp"], res["microbatches"]) == (2, 1, 4)  # m x dp = 4: the global batch kept
    full = uninterrupted_elastic_run.losses  # steps 3..5: the uninterrupted curve, to DCP's rounding
    assert max(abs(x - y) for x, y in zip(res["losses"], full[2:5])) < 1e-5 and len(res["losses"]) == 3
