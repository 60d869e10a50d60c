"""`stagewise train`: the JSON contract, the reference, traces, torchrun, the demo's run, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stagewise import torch_csv
from cli_helpers import fails, run
from stagewise.schedules import generate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TINY = ["--layers", "2", "--d-model", "32", "--seq", "16", "--steps", "2"]
KEYS = {"schedule", "ranks", "microbatches", "losses", "step_time_s", "measured_bubble_fraction",
        "predicted_bubble_fraction", "dp", "recompute", "peak_activation_bytes", "predicted_peak_activation_bytes",
        "peak_memory_allocated_bytes", "layers_built_per_rank", "fsdp", "tp", "zero", "state_bytes",
        "predicted_state_bytes", "parallelism", "tokens", "padding_fraction", "tokens_per_s"}






@pytest.fixture(scope="module")
def reference_losses():
    out = subprocess.run([sys.executable, "-m", "stagewise", "train", "--schedule", "none", "-m", "4", *TINY,
                          "--json"], capture_output=True, text=True, check=True).stdout
    res = json.loads(out)
    assert res["schedule"] == "none" and res["ranks"] == 1
    return res["losses"]


def test_json_follows_the_contract_and_equals_the_reference(capsys, reference_losses):
    rc, out, err = run(capsys, "train", "--schedule", "zb-h1", "-p", "2", "-m", "4", *TINY, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert set(res) == KEYS
    assert (res["schedule"], res["ranks"], res["microbatches"]) == ("zb-h1", 2, 4)
    assert res["layers_built_per_rank"] == [[0, 1], [2, 3]]  # each rank built only its own stage's layers
    np.testing.assert_allclose(res["losses"], reference_losses, rtol=1e-5)
    assert len(res["step_time_s"]) == 2 and all(t > 0 for t in res["step_time_s"])
    assert 0 <= res["measured_bubble_fraction"] < 1 and 0 <= res["predicted_bubble_fraction"] < 1
    assert res["tokens"] == 2 * 8 * 16 and res["padding_fraction"] == 0.0 and res["tokens_per_s"] > 0


def test_text_output_a_csv_schedule_and_a_trace(capsys, tmp_path, reference_losses):
    """A compute+comms CSV lowered by torch's own passes (_add_unshard_reshard, _add_reduce_grad, _add_send_recv):
    the run takes its compute and places its communication by the same rules (stagewise.lowering)."""
    from torch.distributed.pipelining import schedules as S

    sched = generate("interleaved-1f1b", 2, 4)
    rows = torch_csv.dumps(sched).strip().split("\n")
    acts = {r: S._add_reduce_grad(S._add_unshard_reshard([S._Action.from_str(x) for x in row.split(",")]), 4)
            for r, row in enumerate(rows)}
    lowered = S._add_send_recv(acts, stage_to_rank=lambda s: sched.placement[s], num_stages=sched.stages)
    csv = tmp_path / "i.csv"
    csv.write_text("".join(",".join(map(str, lowered[r])) + "\n" for r in sorted(lowered)))
    assert "SEND_F" in csv.read_text() and "UNSHARD" in csv.read_text()
    trace = tmp_path / "run.json"
    rc, out, err = run(capsys, "train", "--csv", str(csv), "-p", "2", "-m", "4", *TINY, "--trace", str(trace),
                       "--draw")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"step 1/2  loss {reference_losses[0]:.4f}")
    assert lines[1].startswith(f"step 2/2  loss {reference_losses[1]:.4f}")
    assert "bubble: measured" in out and "rank 1 |" in out and f"wrote {trace}" in out
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e["cat"] in "FBIW"]
    assert {e["tid"] for e in spans} == {0, 1} and len(spans) == 2 * 4 * 4  # 4 stages x 4 mbs x (F, B)
    # the measured step's collectives on each rank's communication lane, as a simulated lowered step draws them
    ends = [e for e in events if e.get("ph") == "X" and e["cat"] == "STEP_END"]
    assert sorted(e["name"] for e in ends) == ["0STEP_END", "1STEP_END"] and {e["tid"] for e in ends} & {0, 1} == set()


@pytest.mark.parametrize("argv, needle", [
    ([], "--schedule NAME (or --csv FILE, or --schedule none) is required"),
    (["--schedule", "nope"], "unknown schedule 'nope'"),
    (["--schedule", "1f1b", "-m", "4", "--batch", "7"], "--batch 7 does not split into --microbatches 4"),
    (["--schedule", "interleaved-1f1b", "-p", "4", "--layers", "2"], "the model has 4 layers but the schedule "
     "needs 8 stages"),
    (["--schedule", "1f1b", "-p", "2", "--split", "1,1"], "--split 1,1 covers 2 layers; the model has 6"),
    (["--schedule", "1f1b", "--split", "a,b"], "--split a,b: expected layer counts"),
    (["--schedule", "1f1b", "-p", "2", "--split", "E+t*3 | H"], "--split E+t*3 | H: 'E+t*3 | H' has 5 layers and "
     "loses 1 t; the model is E, t*4, H"),
    (["--schedule", "1f1b", "--d-model", "30"], "--d-model 30 must be a multiple of --heads 4"),
    (["--schedule", "1f1b", "--optimizer", "nope", "--steps", "1"], "--optimizer nope: not a torch.optim"),
    (["--schedule", "1f1b", "--trace", "x.xyz"], "--trace x.xyz: unknown suffix"),
    (["--schedule", "1f1b", "--data", "/no/such/file"], "--data /no/such/file: cannot read"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    err = fails(capsys, "train", *argv)
    assert needle in err, err


def test_split_as_layout_text_trains_like_the_reference(capsys, reference_losses):
    from stagewise.cli import build_parser
    from stagewise.cli.train import config_from

    argv = ["train", "--schedule", "1f1b", "-p", "2", "-m", "4", *TINY, "--split", "E | t+t+H"]
    assert config_from(build_parser().parse_args(argv)).layer_split().counts == (1, 3)  # the text's, not even
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    np.testing.assert_allclose(json.loads(out)["losses"], reference_losses, rtol=1e-5)


def test_a_csv_for_more_ranks_than_launched(capsys, tmp_path):
    csv = tmp_path / "four.csv"
    torch_csv.dump(generate("1f1b", 4, 4), csv)
    err = fails(capsys, "train", "--csv", str(csv), "-p", "2", "-m", "4")
    assert "needs 4 ranks (stage 3 is on rank 3); 2 were launched (--ranks 2)" in err


def test_a_text_file_as_data(capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    rc, out, err = run(capsys, "train", "--schedule", "1f1b", "-p", "2", "-m", "2", "--data", str(text), *TINY,
                       "--json")
    assert rc == 0, err
    assert json.loads(out)["losses"][0] == pytest.approx(np.log(256), rel=0.05)  # byte tokens, vocab 256


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun not installed")
def test_the_same_entry_point_runs_under_torchrun(tmp_path, reference_losses):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "stagewise", "train", "--schedule",
                           "dualpipe", "-m", "4", *TINY, "--json"], capture_output=True, text=True, timeout=150,
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)  # rank 0 alone prints
    assert (res["schedule"], res["ranks"]) == ("dualpipe", 2)  # -p defaults to WORLD_SIZE
    np.testing.assert_allclose(res["losses"], reference_losses, rtol=1e-5)


def test_demo_runs_for_real_unless_told_not_to(capsys, tmp_path, monkeypatch):
    import stagewise.cli.demo as demo_cli

    calls = []
    monkeypatch.setattr(demo_cli, "demo_run", lambda out: calls.append(out))
    assert run(capsys, "demo", "--no-run", "-o", str(tmp_path))[0] == 0 and calls == []
    monkeypatch.undo()
    demo_cli.demo_run(tmp_path)  # one rank per core, 2 to 4
    out = capsys.readouterr().out
    z = demo_cli.run_sizes(os.cpu_count() or 1)
    assert out.count("bubble: measured") == 2 and f"1f1b: p={z.ranks} m={z.microbatches}" in out
    assert f"zb-h1: p={z.ranks} m={z.microbatches}" in out
    assert "claims, within 5 points: 1f1b's bubble" in out and "zb-h1's step against 1f1b's, in the predicted order: " in out
    assert (tmp_path / "measured-zb-h1.json").exists() and (tmp_path / "measured-zb-h1.svg").exists()
