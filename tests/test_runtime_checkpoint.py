"""Checkpoints: a resume continues with the uninterrupted run's losses; any layout resumes; broken ones never load.

A step folder is one torch.distributed.checkpoint (DCP) checkpoint with our manifest. Launches: the
uninterrupted run and the saving run together, then every resume at p=2 together (same layout, two other
schedules, and a fallback past an incomplete newer save), the resumes at p=4, a corrupt file, an earlier
stagewise's layer-keyed checkpoint. Resuming under FSDP and tensor parallel: test_runtime_composed.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stagewise.cli import main
from stagewise.flags import say
from stagewise.runtime import RunConfig, RunError
from stagewise.runtime.resilience import checkpoint_files as files
from stagewise.runtime.resilience.checkpoint import rng_state, set_rng_state
from stagewise.runtime.launching.launch import RankFailure
from stagewise.runtime.run.train import train, train_many
from runtime_helpers import TINY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

BASE = RunConfig(schedule="1f1b", ranks=2, microbatches=4, batch=4, steps=4, model=TINY, timeout=30,
                 collect=("params",))


@pytest.fixture(scope="module")
def saving(tmp_path_factory):
    """(the uninterrupted 4-step run, a --save folder holding steps 1 and 2 of the same run, the saving run):
    one launch."""
    root = tmp_path_factory.mktemp("ckpt") / "run"
    full, part = train_many([BASE, dataclasses.replace(BASE, steps=2, save=str(root), save_every=1)])
    assert part.losses == full.losses[:2]
    assert part.checkpoint["saved"] == [str(root / "step-00000001"), str(root / "step-00000002")]
    return full, root, part


@pytest.fixture(scope="module")
def saved(saving):
    return saving[:2]


def copy_of(root: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(root, out)
    return out


@pytest.fixture(scope="module")
def resumed_p2(saved, tmp_path_factory):
    """Resumes at p=2, one launch: the saving layout, zb-h1, dualpipe (two model copies), and a fallback."""
    _, root = saved
    partial = copy_of(root, tmp_path_factory.mktemp("partial"))
    (partial / "step-00000002" / files.MANIFEST).unlink()  # a save of step 2 that did not finish
    cfgs = [dataclasses.replace(BASE, resume=str(root)),
            dataclasses.replace(BASE, resume=str(root), schedule="zb-h1"),
            dataclasses.replace(BASE, resume=str(root), schedule="dualpipe"),
            dataclasses.replace(BASE, resume=str(partial))]
    return dict(zip(("same", "zb-h1", "dualpipe", "fallback"), train_many(cfgs)))


def test_a_resume_gives_exactly_the_losses_and_weights_of_the_uninterrupted_run(saved, resumed_p2):
    full, root = saved
    res = resumed_p2["same"]
    assert res.losses == full.losses[2:]  # bit for bit: weights, AdamW moments and step count restored
    for name, copies in res.params.items():
        for c, ref in zip(copies, full.params[name]):
            assert np.array_equal(c, ref), name
    ck = res.checkpoint
    assert (ck["resumed_from"], ck["resumed_step"], ck["rng_restored"]) == (str(root / "step-00000002"), 2, True)


@pytest.mark.parametrize("key", ["zb-h1", "dualpipe"])
def test_another_schedule_resumes_the_same_training(saved, resumed_p2, key):
    full, _ = saved
    res = resumed_p2[key]
    assert res.schedule == key and len(res.losses) == 2
    np.testing.assert_allclose(res.losses, full.losses[2:], rtol=1e-5)
    assert res.checkpoint["rng_restored"] is False  # another layout draws differently anyway


def test_an_incomplete_newest_save_falls_back_to_the_previous_complete_one(saved, resumed_p2):
    full, _ = saved
    res = resumed_p2["fallback"]
    assert res.checkpoint["resumed_step"] == 1 and res.losses == full.losses[1:]
    assert res.checkpoint["skipped"] == ["step-00000002 has no manifest.json (its save did not finish)"]


def test_another_number_of_ranks_resumes_the_same_training(saved):
    full, root = saved
    cfgs = [dataclasses.replace(BASE, resume=str(root), ranks=4),
            dataclasses.replace(BASE, resume=str(root), ranks=4, schedule="interleaved-1f1b")]  # 8 stages
    for res in train_many(cfgs):
        np.testing.assert_allclose(res.losses, full.losses[2:], rtol=1e-5, err_msg=res.schedule)


def test_the_folder_is_one_dcp_checkpoint_that_torch_reads_into_the_plain_model(saving):
    """Every rank wrote its share in parallel (a DCP data file each, rank 0 the index), the manifest lists
    every file; torch's own dcp.load fills the unpipelined model and its AdamW state under the original
    names: exactly the saving run's weights after step 2."""
    import torch.distributed.checkpoint as dcp
    from torch import nn

    _, root, part = saving
    folder = root / "step-00000002"
    manifest = json.loads((folder / files.MANIFEST).read_text())
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", files.rng_file(0),
                                         files.rng_file(1)]
    assert manifest["format"] == "stagewise-checkpoint/3" and manifest["step"] == 2
    assert manifest["data"] == {"next_step": 2, "batch": 4, "sequences": 8}
    assert manifest["optimizer"] == "AdamW" and manifest["layers"] == TINY.num_layers
    assert manifest["params"]["0.tok.weight"]["layer"] == 0  # the tied head is the embedding's parameter
    assert not any(n.startswith(f"{TINY.num_layers - 1}.weight") for n in manifest["params"])
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name != ".metadata"]
    model = nn.Sequential(*TINY.layers().build_all())
    opt = torch.optim.AdamW(model.parameters())
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    for name, copies in part.params.items():
        assert np.array_equal(state["model"][name].numpy(), copies[0]), name
    optim = {"optim": {f"state.1.fc.weight.{k}": torch.zeros(()) if k == "step" else torch.zeros(4 * 32, 32)
                       for k in ("step", "exp_avg", "exp_avg_sq")}}
    dcp.load(optim, checkpoint_id=str(folder), no_dist=True)
    assert float(optim["optim"]["state.1.fc.weight.step"]) == 2.0
    assert optim["optim"]["state.1.fc.weight.exp_avg_sq"].min() > 0
    del opt


def test_a_corrupt_file_is_refused_by_name_on_every_rank(saved, tmp_path):
    _, root = saved
    bad = copy_of(root, tmp_path)
    path = bad / "step-00000002" / "__1_0.distcp"  # rank 1's share: hashed by rank 1, refused by all
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    path.write_bytes(bytes(data))
    with pytest.raises(RankFailure) as info:
        train(dataclasses.replace(BASE, resume=str(bad)))
    assert info.value.user
    assert f"every rank: --resume {bad / 'step-00000002'}: __1_0.distcp is corrupt" in say(str(info.value))


def test_a_truncated_file_or_a_missing_manifest_is_refused_before_any_rank_starts(saved, tmp_path):
    _, root = saved
    bad = copy_of(root, tmp_path)
    step2 = bad / "step-00000002"
    with open(step2 / "__0_0.distcp", "r+b") as f:
        f.truncate(100)
    with pytest.raises(RunError, match=r"step-00000002: step-00000002/__0_0.distcp has 100 bytes, the manifest "
                       r"says \d+; refusing to load it \(the newest complete one is .*step-00000001; or resume "):
        train(dataclasses.replace(BASE, resume=str(step2)))
    (bad / "step-00000001" / files.MANIFEST).unlink()
    with pytest.raises(RunError, match=r"no complete checkpoint \(step-00000002/__0_0.distcp has 100 bytes.*; "
                       r"step-00000001 has no manifest.json \(its save did not finish\)\)"):
        train(dataclasses.replace(BASE, resume=str(bad)))


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "f.pt"
    entry = files.atomic_write(path, b"old")
    assert entry["bytes"] == 3 and path.read_bytes() == b"old"

    def crash(*_):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        files.atomic_write(path, b"new contents")
    assert path.read_bytes() == b"old"


def test_rng_states_round_trip_through_a_weights_only_file():
    import numpy  # noqa: F401 - imported, so its state is saved too

    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    buf = io.BytesIO()
    torch.save(rng_state(torch.device("cpu")), buf)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(2), random.seed(2), np.random.seed(2)
    set_rng_state(torch.load(io.BytesIO(buf.getvalue()), weights_only=True), torch.device("cpu"))
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def run_cli(capsys, *argv: str):
    try:
        rc = main(["train", *argv])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_bad_checkpoint_options_exit_2_before_any_rank_starts(capsys, tmp_path, saved):
    _, root = saved
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    tiny = ["--schedule", "1f1b", "-p", "2", "-m", "4", "--layers", "6", "--d-model", "32", "--seq", "16"]
    cases = [
        (["--resume", str(tmp_path / "nope")], f"--resume {tmp_path / 'nope'}: no such directory"),
        (["--resume", str(tmp_path)], "no checkpoint there (expected step-NNNNNNNN folders written by --save)"),
        (["--save", str(a_file / "sub")], f"--save {a_file / 'sub'}: cannot write there"),
        (["--save", str(a_file)], "exists and is not a directory"),
        (["--save-every", "2"], "--save-every 2 needs --save DIR"),
        (["--save", str(root / "step-00000002")], "is one checkpoint's step folder; give the folder that holds"),
        (["--overwrite"], "--overwrite needs --save DIR"),
        (["--resume", str(root), "--steps", "2"], "the checkpoint is at step 2 and --steps is 2"),
        (["--resume", str(root), "--steps", "3", "--optimizer", "sgd"],
         "it holds AdamW state; --optimizer is SGD (give --optimizer adamw)"),
        (["--resume", str(root), "--steps", "3", "--layers", "4"],
         "a checkpoint of another model or data (--layers 6 there, 4 here); give the options of the run"),
    ]
    for extra, needle in cases:
        rc, _, err = run_cli(capsys, *tiny, *extra)
        assert rc == 2 and err.count("\n") == 1 and needle in err, (extra, err)
    rc, _, err = run_cli(capsys, "--schedule", "none", "--save", str(tmp_path / "s"), "--save-on-signal", "5")
    assert rc == 2 and "--save-on-signal needs a --schedule run on ranks" in err  # the reference saves (issue 44)


def test_data_parallel_replicas_save_one_copy_that_a_single_pipeline_resumes(tmp_path):
    import torch.distributed.checkpoint as dcp

    root = tmp_path / "dp"
    base = dataclasses.replace(BASE, batch=8, collect=())
    (part,) = train_many([dataclasses.replace(base, dp=2, steps=2, save=str(root))])  # 2 pipelines x 2 ranks
    manifest = json.loads((root / "step-00000002" / files.MANIFEST).read_text())
    assert manifest["world"] == 4 and manifest["layout"]["replicas"] == 2
    assert {files.rng_file(r) for r in range(4)} <= set(manifest["files"])
    meta = dcp.FileSystemReader(str(root / "step-00000002")).read_metadata()
    written = {}  # each tensor's chunks, from whichever rank wrote them: the replicas' copies once
    for index, info in meta.storage_data.items():
        written.setdefault(index.fqn, []).append(info.length)
    assert all(len(lengths) == 1 for lengths in written.values())
    full, res = train_many([base, dataclasses.replace(base, resume=str(root))])  # one pipeline, the whole batch
    np.testing.assert_allclose(part.losses, full.losses[:2], rtol=1e-5)
    np.testing.assert_allclose(res.losses, full.losses[2:], rtol=1e-5)
    assert res.checkpoint["rng_restored"] is False


TINY_ARGS = ["--schedule", "1f1b", "-p", "2", "-m", "4", "--batch", "4", "--layers", "6", "--d-model", "32", "--seq",
             "16"]  # BASE through the CLI


def manifests_of(root: Path) -> dict:
    return {d.name: (d / files.MANIFEST).read_bytes() for d in sorted(root.glob("step-*"))}


def test_another_runs_folder_is_refused_before_any_rank_starts_and_left_as_it_was(capsys, tmp_path, saved,
                                                                                   monkeypatch):
    _, root = saved
    mine = copy_of(root, tmp_path)
    before = manifests_of(mine)
    import stagewise.runtime.launching.launch as launch

    monkeypatch.setattr(launch, "spawn", lambda *a, **k: pytest.fail("ranks started"))
    for extra in ([], ["--resume", str(tmp_path / "other")]):  # a fresh run; a resume of another run
        if extra:
            other = copy_of(root, tmp_path / "o")
            shutil.move(other, tmp_path / "other")
            m = json.loads((tmp_path / "other" / "step-00000002" / files.MANIFEST).read_text())
            m["run"]["id"] = "0" * 32  # the same model, but another run's lineage
            files.write_manifest(tmp_path / "other" / "step-00000002", m)
        rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--save", str(mine), *extra)
        assert rc == 2 and err.count("\n") == 1, err
        assert (f"--save {mine}: holds checkpoints of another run (step-00000002 and 1 more, run "
                f"{json.loads(before['step-00000002'])['run']['id'][:8]}") in err
        assert "give --overwrite to replace them, or another --save folder" in err
    assert manifests_of(mine) == before


def test_overwrite_replaces_another_run_and_a_resume_saves_into_its_own_run(capsys, tmp_path, saved):
    full, root = saved
    mine = copy_of(root, tmp_path)
    stray = mine / "step-00000001" / ".layer-00000.pt.tmp-99999"  # left by a save that crashed
    stray.write_bytes(b"partial")
    # the run that saved `mine` goes on saving there: same run id, step 3 beside steps 1 and 2
    rc, out, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--resume", str(mine), "--save", str(mine), "--json")
    assert rc == 0, err
    assert json.loads(out)["losses"] == pytest.approx(full.losses[2:3], rel=1e-6)
    ids = {json.loads(m)["run"]["id"] for m in manifests_of(mine).values()}
    assert len(ids) == 1 and sorted(manifests_of(mine)) == [f"step-0000000{i}" for i in (1, 2, 3)]
    assert not stray.exists()
    # another run, told to --overwrite: every step of the old run goes, so no resume can mix the two
    rc, out, err = run_cli(capsys, *TINY_ARGS, "--steps", "1", "--save", str(mine), "--overwrite", "--seed", "5")
    assert rc == 0, err
    assert "--save: deleted step-00000001, step-00000002, step-00000003" in out
    assert "exported" not in out  # the built-in GPT writes no HF folder, so none is announced
    after = manifests_of(mine)
    assert sorted(after) == ["step-00000001"] and json.loads(after["step-00000001"])["run"]["id"] not in ids


def test_a_resumed_run_numbers_its_statistics_by_the_steps_it_ran(capsys, saved):
    """Issue 44: after resuming at step 2, steps 3 and 4 run; the summary says so (it said "steps 2..2")."""
    _, root = saved
    rc, out, err = run_cli(capsys, *TINY_ARGS, "--steps", "4", "--resume", str(root))
    assert rc == 0, err
    assert "mean step" in out and "(step 3 excluded as warm-up)" in out and "bubble: measured" in out
    assert "% (step 4), predicted" in out and "2..2" not in out, out


def test_a_checkpoint_of_another_model_seed_or_data_is_refused_saying_what_differs(capsys, tmp_path, saved):
    _, root = saved
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 4)
    cases = [
        (["--d-model", "64"], "(--d-model 32 there, 64 here)"),
        (["--heads", "2", "--vocab", "128"], "(--heads 4 there, 2 here; --vocab 64 there, 128 here)"),
        (["--dtype", "float64"], "(--dtype float32 there, float64 here)"),
        (["--seed", "1"], "(--seed 0 there, 1 here)"),
        (["--data", str(text), "--vocab", "256"], f"--data synthetic there, {text} (1024 bytes, SHA-256"),
    ]
    for extra, needle in cases:
        rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--resume", str(root), *extra)
        assert rc == 2 and err.count("\n") == 1, err
        assert f"--resume {root / 'step-00000002'}: a checkpoint of another model or data " in err, err
        assert needle in err, err
    # the schedule, p and the batch may differ: those resume (test_another_schedule_resumes_the_same_training)
    assert files.preflight(dataclasses.replace(BASE, resume=str(root), schedule="zb-v", ranks=4, batch=16)) is not None


@pytest.mark.parametrize("edit, needle", [
    (lambda m: [], "is malformed: not a JSON object"),
    (lambda m: {**m, "step": -5}, "is malformed: step must be an integer >= 1; got -5"),
    (lambda m: {**m, "step": "2"}, "is malformed: step must be an integer >= 1; got '2'"),
    (lambda m: {**m, "step": 3}, "is malformed: step 3 in a folder named step-00000002"),
    (lambda m: {k: v for k, v in m.items() if k != "files"}, "is malformed: files is missing"),
    (lambda m: {**m, "files": []}, "is malformed: files must be a JSON object; got []"),
    (lambda m: {**m, "files": {"../../etc/passwd": {"bytes": 1, "sha256": "0" * 64}}},
     "is malformed: files: '../../etc/passwd' is not a checkpoint file name"),
    (lambda m: {**m, "files": {**m["files"], "layer-00000.pt": {"bytes": 1.5, "sha256": "x"}}},
     "is malformed: files['layer-00000.pt'].bytes must be an integer >= 0; got 1.5"),
    (lambda m: {**m, "run": {**m["run"], "id": None}}, "is malformed: run.id must be a run id (32 hex); got None"),
    (lambda m: {**m, "params": {"0.tok.weight": {"layer": 0, "shape": [-1], "dtype": "f"}}},
     "is malformed: params['0.tok.weight'].shape must be a list of sizes; got [-1]"),
    (lambda m: {**m, "format": "stagewise-checkpoint/1"},
     "is malformed: not a stagewise-checkpoint/3 manifest (format 'stagewise-checkpoint/1')"),
])
def test_a_manifest_of_the_wrong_shape_is_refused_in_one_line(capsys, tmp_path, saved, edit, needle):
    _, root = saved
    bad = copy_of(root, tmp_path)
    step2 = bad / "step-00000002"
    m = json.loads((step2 / files.MANIFEST).read_text())
    (step2 / files.MANIFEST).write_text(json.dumps(edit(m)))
    rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--resume", str(step2))
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--resume {step2}: step-00000002/manifest.json {needle}; refusing to load it" in err, err
    found = files.find(str(bad))  # the folder's newest good checkpoint is taken instead, saying why
    assert found.folder.name == "step-00000001" and needle in found.skipped[0]


@pytest.mark.parametrize("raw", [b"\xff\xfe not utf-8", b"[" * 100_000, b'{"step": 1e999999}', b""])
def test_a_manifest_that_is_not_json_is_refused(capsys, tmp_path, saved, raw):
    _, root = saved
    bad = copy_of(root, tmp_path)
    (bad / "step-00000002" / files.MANIFEST).write_bytes(raw)
    rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--resume", str(bad / "step-00000002"))
    assert rc == 2 and err.count("\n") == 1 and "manifest.json is " in err, err


def test_a_full_disk_names_the_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    target = tmp_path / "step-00000001" / files.layer_file(3)
    target.parent.mkdir()
    with pytest.raises(OSError) as info:
        files.atomic_write(target, b"weights")
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == f"[Errno 28] cannot write checkpoint file {target}: No space left on device"
    assert list(target.parent.iterdir()) == []


def test_a_concurrent_run_that_saved_since_the_launch_is_refused_at_the_first_save(tmp_path, saved):
    _, root = saved
    mine = copy_of(root, tmp_path)
    with pytest.raises(RunError, match="holds checkpoints of another run"):
        files.prepare_save(str(mine), "f" * 32, overwrite=False)
    assert files.prepare_save(str(mine), "f" * 32, overwrite=True) == ["step-00000001", "step-00000002"]


def _rehash(folder: Path, name: str) -> None:
    """Make the manifest agree with whatever ``name`` now holds (what a careless edit or a swap would do)."""
    import hashlib

    m = json.loads((folder / files.MANIFEST).read_text())
    data = (folder / name).read_bytes()
    m["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / files.MANIFEST).write_text(json.dumps(m))


def test_files_that_match_their_hash_but_are_not_ours_are_refused_by_name(capsys, saved, tmp_path):
    """Random bytes with the manifest's hash updated (in a data file, in DCP's index), and two ranks' data files
    swapped: exit 2 naming the file, before any of it is read as a tensor where that can be told."""
    _, root = saved
    tiny = ["--schedule", "1f1b", "-p", "2", "-m", "4", "--layers", "6", "--d-model", "32", "--seq", "16",
            "--batch", "4", "--steps", "3"]
    cases = {"__0_0.distcp": "__0_0.distcp does not read as the tensors .metadata says it holds (damaged",
             ".metadata": ".metadata is not the index of a DCP checkpoint"}
    for name, needle in cases.items():
        noise = copy_of(root, tmp_path / f"noise{name}")
        step = noise / "step-00000002"
        (step / name).write_bytes(os.urandom((step / name).stat().st_size))  # same size: the index still fits
        _rehash(step, name)
        rc, _, err = run_cli(capsys, *tiny, "--resume", str(noise))
        assert rc == 2 and needle in err and err.count("\n") == 1, err
    swapped = copy_of(root, tmp_path / "swapped")
    step = swapped / "step-00000002"
    a, b = step / "__0_0.distcp", step / "__1_0.distcp"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    _rehash(step, a.name)
    _rehash(step, b.name)
    rc, _, err = run_cli(capsys, *tiny, "--resume", str(swapped))
    assert rc == 2 and "__0_0.distcp does not hold what .metadata says is in it" in err, err
    assert "swapped or edited" in err and err.count("\n") == 1, err


def test_a_save_folder_is_checked_before_the_first_step_and_never_written_through(capsys, saved, tmp_path):
    """Foreign files (a corpus), a symlink to elsewhere, a file where a step folder goes, a FIFO manifest:
    each refused before any rank starts; nothing of them is touched."""
    _, root = saved
    tiny = ["--schedule", "1f1b", "-p", "2", "-m", "4", "--layers", "6", "--d-model", "32", "--seq", "16",
            "--batch", "4", "--steps", "2"]
    corpus = tmp_path / "data"
    corpus.mkdir()
    (corpus / "train.txt").write_text("a corpus the user wrote")
    rc, _, err = run_cli(capsys, *tiny, "--save", str(corpus))
    assert rc == 2 and "holds train.txt, which is not a checkpoint" in err
    assert (corpus / "train.txt").read_text() == "a corpus the user wrote" and sorted(corpus.iterdir()) == [
        corpus / "train.txt"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "step-00000002").symlink_to(elsewhere)
    rc, _, err = run_cli(capsys, *tiny, "--save", str(linked), "--overwrite")
    assert rc == 2 and "step-00000002 is a symlink" in err and not any(elsewhere.iterdir())
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "step-00000002").write_text("a file of the user's")
    rc, _, err = run_cli(capsys, *tiny, "--save", str(blocked), "--overwrite")
    assert rc == 2 and "step-00000002 is a file where step 2's checkpoint folder goes" in err
    fifo_run = copy_of(root, tmp_path / "fifo")
    manifest = fifo_run / "step-00000002" / files.MANIFEST
    manifest.unlink()
    os.mkfifo(manifest)  # opening it for reading would block forever
    rc, _, err = run_cli(capsys, *tiny, "--steps", "3", "--resume", str(fifo_run / "step-00000002"))
    assert rc == 2 and "manifest.json is unreadable" in err and "not a regular file (a FIFO)" in err, err


def as_layer_checkpoint(step: Path, out: Path) -> Path:
    """``step``'s contents as an earlier stagewise wrote them (stagewise-checkpoint/2): one torch.save file per
    model layer with its logical parameters and their optimizer state, the RNG files, the manifest last."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out.mkdir(parents=True)
    dcp_to_torch_save(str(step), str(out / "whole.pt"))
    whole = torch.load(out / "whole.pt", weights_only=False)
    (out / "whole.pt").unlink()
    m = json.loads((step / files.MANIFEST).read_text())
    payloads: dict[int, dict] = {}
    for name in m["params"]:  # the built-in GPT's original names are its logical ones
        p = payloads.setdefault(int(name.split(".")[0]), {"params": {}, "optim": {}})
        p["params"][name] = whole["model"][name]
        p["optim"][name] = {k: whole["optim"][f"state.{name}.{k}"] for k in ("step", "exp_avg", "exp_avg_sq")}
    entries = {}
    for layer, payload in payloads.items():
        buf = io.BytesIO()
        torch.save(payload, buf)
        entries[files.layer_file(layer)] = files.atomic_write(out / files.layer_file(layer), buf.getvalue())
    for rng in (n for n in m["files"] if n.startswith("rng-")):
        shutil.copy(step / rng, out / rng)
        entries[rng] = m["files"][rng]
    files.write_manifest(out, {**m, "format": "stagewise-checkpoint/2", "files": entries})
    return out


def test_a_layer_keyed_checkpoint_of_an_earlier_stagewise_resumes_under_any_layout(saved, tmp_path):
    full, root = saved
    old = as_layer_checkpoint(root / "step-00000002", tmp_path / "old" / "step-00000002")
    assert sorted(p.name for p in old.iterdir())[:2] == ["layer-00000.pt", "layer-00001.pt"]
    same, other = train_many([dataclasses.replace(BASE, resume=str(old)),
                              dataclasses.replace(BASE, resume=str(old), ranks=1, fsdp=2, microbatches=2)])
    assert same.losses == full.losses[2:] and same.checkpoint["rng_restored"]  # the same layout: bit for bit
    np.testing.assert_allclose(other.losses, full.losses[2:], rtol=1e-5)  # sharded: each rank its own rows


# ---- hostile checkpoints (issue 26): code in the index, damaged data files, a manifest that lies

class Touch:
    """A pickle that creates ``path`` when unpickled: what a crafted index runs under a plain ``pickle.load``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _index(step: Path):
    from stagewise.runtime.resilience.checkpoint_index import read

    return read(step / ".metadata")


def _write_index(step: Path, md) -> None:
    import pickle

    (step / ".metadata").write_bytes(pickle.dumps(md))
    _rehash(step, ".metadata")


def _flip_zip_end(step: Path, name: str) -> None:
    """Two bytes of the end record of the zip that holds one of ``name``'s tensors (its signature)."""
    info = next(v for i, v in _index(step).storage_data.items() if v.relative_path == name
                and i.fqn.startswith("model.") and ".fc.weight" in i.fqn)
    data = bytearray((step / name).read_bytes())
    at = data.rfind(b"PK\x05\x06", info.offset, info.offset + info.length)
    data[at] ^= 0xFF
    data[at + 1] ^= 0xFF
    (step / name).write_bytes(bytes(data))
    _rehash(step, name)


def _edit_manifest(step: Path, edit) -> None:
    m = json.loads((step / files.MANIFEST).read_text())
    edit(m)
    (step / files.MANIFEST).write_text(json.dumps(m))


def _hostile(root: Path, tmp_path: Path, marker: Path) -> dict[str, tuple[Path, str]]:
    """Copies of ``root`` each broken one way (the manifest rehashed to agree), with what the refusal says."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    def index_edit(md, how):
        if how == "bytes":
            md.state_dict_metadata["model.1.fc.weight"] = BytesStorageMetadata()
        elif how == "shape":
            md.state_dict_metadata["model.1.fc.weight"].size = torch.Size([256, 32])
        else:
            del md.state_dict_metadata["optim.state.1.fc.weight.exp_avg"]
        return md

    cases = {
        "code in the index": (lambda s: ((s / ".metadata").write_bytes(__import__("pickle").dumps(Touch(marker))),
                                         _rehash(s, ".metadata")),
                              ".metadata is not the index of a DCP checkpoint (io.open is not a type of a DCP index)"),
        "bytes for a tensor": (lambda s: _write_index(s, index_edit(_index(s), "bytes")),
                               "its parameter or buffer 1.fc.weight is not a tensor"),
        "index shape": (lambda s: _write_index(s, index_edit(_index(s), "shape")),
                        "its parameter or buffer 1.fc.weight has shape (256, 32); this model's has (128, 32)"),
        "no exp_avg": (lambda s: _write_index(s, index_edit(_index(s), "optim")),
                       "it holds no optimizer state exp_avg of 1.fc.weight"),
        "absurd frame length": (lambda s: ((s / ".metadata").write_bytes(b"\x80\x05\x95" + b"\xff" * 8 + b"N."),
                                           _rehash(s, ".metadata")),
                                ".metadata is not the index of a DCP checkpoint (not a pickle DCP wrote "
                                "(OverflowError))"),
        "zeroed data": (lambda s: ((s / "__0_0.distcp").write_bytes(bytes((s / "__0_0.distcp").stat().st_size)),
                                   _rehash(s, "__0_0.distcp")),
                        "__0_0.distcp does not read as the tensors .metadata says it holds (damaged, or not a DCP "
                        "data file: UnpicklingError)"),
        "zip end record": (lambda s: _flip_zip_end(s, "__1_0.distcp"),
                           "__1_0.distcp does not read as the tensors .metadata says it holds"),
        "manifest shape": (lambda s: _edit_manifest(s, lambda m: m["params"]["1.fc.weight"].update(shape=[64, 32])),
                           "saved from another model (parameter 1.fc.weight has shape (64, 32) there, (128, 32) "
                           "here)"),
        "manifest entry gone": (lambda s: _edit_manifest(s, lambda m: m["params"].pop("1.fc.weight")),
                                "saved from another model (this model has parameter 1.fc.weight, the other does "
                                "not; 75 parameters there, 76 here)"),
    }
    out = {}
    for k, (label, (edit, words)) in enumerate(cases.items()):
        bad = copy_of(root, tmp_path / f"case{k}")
        edit(bad / "step-00000002")
        out[label] = (bad / "step-00000002", words)
    return out


def test_hostile_checkpoints_are_refused_by_name_on_every_rank_and_run_no_code(saved, tmp_path):
    """One launch, one job per broken checkpoint: every rank refuses each with the same message, before it
    trusts a byte; the pickle in the index never ran (its file was never made); an earlier stagewise's layer
    file that is not a state dict is refused too."""
    from runtime_helpers import resume_each
    from stagewise.runtime.launching.local import launch

    full, root = saved
    marker = tmp_path / "the index ran"
    cases = _hostile(root, tmp_path, marker)
    old = as_layer_checkpoint(root / "step-00000002", tmp_path / "old" / "step-00000002")
    torch.save({"params": {"0.tok.weight": [1.0, 2.0]}, "optim": {}}, old / "layer-00000.pt")
    _rehash(old, "layer-00000.pt")
    cases["layer file"] = (old, "layer-00000.pt is not a layer file of a checkpoint (its parameter "
                                "'0.tok.weight' is not a tensor)")
    cfgs = [dataclasses.replace(BASE, steps=3, resume=str(step), collect=()) for step, _ in cases.values()]
    got = launch(resume_each, 2, cfgs, threads=1)  # [rank 0's messages, rank 1's]
    for (label, (step, words)), per_rank in zip(cases.items(), zip(*got)):
        assert per_rank[0] == per_rank[1] and per_rank[0] is not None, (label, per_rank)
        assert per_rank[0].startswith(f"`resume` {step}: ") and words in per_rank[0], (label, per_rank[0])
    assert not marker.exists()


def test_hostile_checkpoints_are_one_line_from_the_cli(capsys, saved, tmp_path):
    """The unpipelined reference (one process, no launch) refuses each alike, in one line with exit 2; on ranks
    the line says every rank, and nothing of DCP's exception leaks (it named no file)."""
    _, root = saved
    marker = tmp_path / "the index ran"
    cases = _hostile(root, tmp_path, marker)
    for label, (step, words) in cases.items():
        rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--schedule", "none", "--resume", str(step))
        assert rc == 2 and err.count("\n") == 1 and say(words) in err, (label, err)
    step, words = cases["zeroed data"]
    rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--resume", str(step))
    assert rc == 2 and err.count("\n") == 1 and f"every rank: --resume {step}: {words}" in err, err
    assert "CheckpointException" not in err and "Traceback" not in err
    assert not marker.exists()


def test_a_garbled_rng_file_is_refused_by_name_in_one_line(capsys, saved, tmp_path):
    """Issue 44, the class of 'a garbled file ends in a traceback': RNG files whose bytes (rehashed into the
    manifest) are no RNG state are named, on the ranks that read them, in one line with exit 2."""
    _, root = saved
    bad = copy_of(root, tmp_path) / "step-00000002"
    for rank in (0, 1):
        (bad / files.rng_file(rank)).write_bytes(b"\x80\x02}q\x00.")  # an empty dict: no generator in it
        _rehash(bad, files.rng_file(rank))
    rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "3", "--resume", str(bad))
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--resume {bad}: rng-rank-0000" in err and "is not an RNG state of a checkpoint (" in err, err


# ---- --overwrite deletes only what a checkpoint's manifest lists

def test_overwrite_refuses_a_users_file_in_an_old_step_folder_and_deletes_nothing(capsys, saved, tmp_path,
                                                                                  monkeypatch):
    import stagewise.runtime.launching.launch as launch

    _, root = saved
    mine = copy_of(root, tmp_path)
    (mine / "step-00000002" / "README.txt").write_text("notes of the user's")
    (mine / "step-00000001" / "extra").mkdir()
    before = sorted(p.relative_to(mine) for p in mine.rglob("*"))
    monkeypatch.setattr(launch, "spawn", lambda *a, **k: pytest.fail("ranks started"))
    rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "1", "--seed", "5", "--save", str(mine), "--overwrite")
    assert rc == 2 and err.count("\n") == 1, err
    assert (f"--save {mine}: step-00000001/extra and 1 more is not a file of a checkpoint; --overwrite deletes "
            "only what a checkpoint's manifest lists") in err
    assert sorted(p.relative_to(mine) for p in mine.rglob("*")) == before
    (mine / "step-00000001" / "extra").rmdir()
    with pytest.raises(RunError, match="step-00000002/README.txt is not a file of a checkpoint"):
        files.prepare_save(str(mine), "f" * 32, overwrite=True)  # a file put there later
    assert (mine / "step-00000002" / "README.txt").read_text() == "notes of the user's"


def test_overwrite_never_follows_a_symlink_out_of_the_folder(capsys, saved, tmp_path):
    _, root = saved
    outside = tmp_path / "outside"
    shutil.copytree(root / "step-00000001", outside)  # a checkpoint's files, and the user's own
    (outside / "keep.txt").write_text("the user's")
    before = sorted(p.name for p in outside.iterdir())
    linked = copy_of(root, tmp_path / "l")
    shutil.rmtree(linked / "step-00000001")
    (linked / "step-00000001").symlink_to(outside)
    inner = copy_of(root, tmp_path / "i")
    (inner / "step-00000002" / "__0_0.distcp").unlink()
    (inner / "step-00000002" / "__0_0.distcp").symlink_to(outside / "__0_0.distcp")
    for folder, needle in ((linked, "step-00000001 is a symlink"),
                           (inner, "step-00000002/__0_0.distcp (a symlink) is not a file of a checkpoint")):
        rc, _, err = run_cli(capsys, *TINY_ARGS, "--steps", "1", "--save", str(folder), "--overwrite")
        assert rc == 2 and needle in err, err
    with pytest.raises(RunError, match=r"step-00000001 \(a symlink\) is not a file of a checkpoint"):
        files.check_overwrite(str(linked), None)  # the first save's own check, should a link appear later
    assert sorted(p.name for p in outside.iterdir()) == before and (outside / "keep.txt").exists()
