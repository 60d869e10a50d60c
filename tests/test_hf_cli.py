"""`stagewise train --hf` as a user meets it: a folder or a config.json, the JSON result, the saved folder, errors.

An --hf run is the runtime's one run path (RunConfig -> RankTrainer -> RunResult): the same JSON as the built-in
GPT's, the same checkpoints (resumable under another schedule and p), each with an HF folder from_pretrained loads,
and the same restarts when a rank is lost (re-planned for the ranks left).
"""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402
from conftest import ELASTIC_LAYOUT, LOSE_RANK_3, SHRINK, shrunk  # noqa: E402
from hf_helpers import CONFIGS, hf_model, save_tiny, write_config  # noqa: E402

from stagewise.hf.data import TextData  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TINY = ["--seq", "16", "--steps", "3", "-m", "4", "--batch", "8"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfcli")
    text = root / "train.txt"
    text.write_text("A pipeline keeps every rank busy when the schedule is good. " * 30)
    return root, save_tiny("llama", root / "llama"), text


def test_train_a_folder_under_zbv_equals_the_plain_loop_and_saves_an_hf_folder(capsys, files):
    from transformers import AutoModelForCausalLM

    root, folder, text = files
    out_dir = root / "trained"
    rc, out, err = run(capsys, "train", "--hf", str(folder), "--data", str(text), "--schedule", "zb-v", "-p", "2",
                       *TINY, "--save", str(out_dir), "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert (res["schedule"], res["ranks"], res["microbatches"]) == ("zb-v", 2, 4)
    model, data = hf_model(folder), TextData(path=str(text), seq=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the CLI's default optimizer
    for k, got in enumerate(res["losses"]):
        ids, labels = data.batch(k, 8)
        loss = model(ids, labels=labels).loss
        assert abs(got - loss.item()) <= 1e-4 * loss.item(), (k, got, loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    both = sum(res["read_bytes_per_rank"])  # each rank read its share; together the checkpoint once
    assert 0 < min(res["read_bytes_per_rank"]) and both == sum(p.numel() * 4 for p in hf_model(folder).parameters())
    # zb-v at p=2: stages 0 and 3 on rank 0, 1 and 2 on rank 1; 6 layers cut 2, 2, 1, 1: each rank built its own
    assert res["layers_built_per_rank"] == [[0, 1, 5], [2, 3, 4]]
    back = AutoModelForCausalLM.from_pretrained(out_dir / "step-00000003" / "hf")
    for name, p in model.state_dict().items():  # Adam: near-zero gradients' rounding becomes +-lr, so a norm
        assert (back.state_dict()[name] - p).norm() <= 1e-4 * p.norm(), name


def test_a_config_json_trains_from_random_weights_with_text_output(capsys, files, tmp_path):
    root, _, text = files
    config = write_config(tmp_path / "config.json", **CONFIGS["gpt2"])
    trace = tmp_path / "t.json"
    rc, out, err = run(capsys, "train", "--hf", str(config), "--data", str(text), "--schedule", "1f1b", "-p", "2",
                       *TINY, "--trace", str(trace), "--draw")
    assert rc == 0, err
    assert "1f1b: p=2 m=4, mean step" in out and "bubble: measured" in out
    assert "rank 1 |" in out and f"wrote {trace}" in out  # the drawn and the written measured timeline
    events = json.loads(trace.read_text())
    assert any("F" in str(e.get("name", "")) for e in events.get("traceEvents", events))


def test_bad_input_is_one_line_and_exit_2(capsys, files, tmp_path):
    root, folder, text = files
    base = ["train", "--data", str(text), "--schedule", "1f1b", "-p", "2"]
    bert = write_config(tmp_path / "config.json", model_type="bert", architectures=["BertForMaskedLM"])
    assert "model_type 'bert' (BertForMaskedLM) is not supported" in fails(capsys, *base, "--hf", str(bert))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((folder / "config.json").read_text())
    assert "no model.safetensors or model.safetensors.index.json" in fails(capsys, *base, "--hf", str(empty))
    err = fails(capsys, "train", "--hf", str(folder), "--data", str(text), "--schedule", "zb-v", "-p", "4", "-m", "8")
    assert "the model has 3 decoder layers (6 layers with the embedding, final norm and LM head) but the schedule " \
           "needs 8 stages per model copy" in err
    assert "--hf needs --data" in fails(capsys, "train", "--hf", str(folder), "--schedule", "1f1b")
    assert "--tokenizer needs --hf" in fails(capsys, "train", "--schedule", "1f1b", "--tokenizer", str(folder))
    assert "--resume x: no such directory" in fails(capsys, *base, "--hf", str(folder), "--resume", "x")
    assert "--batch 6 does not split" in fails(capsys, *base, "--hf", str(folder), "-m", "4", "--batch", "6")
    assert "--split E+t*2 | H: 'E+t*2 | H' has 4 layers and loses 1 t, 1 N" in fails(capsys, *base, "--hf", str(folder), "--split",
                                                                "E+t*2 | H")
    huge = "99999999999999999999999"  # torch's manual_seed overflowed on it, on every rank
    assert f"--seed {huge}: torch seeds are 0..4294967295" in fails(capsys, *base, "--hf", str(folder), "--seed", huge)
    assert "--seed must be >= 0; got -3" in fails(capsys, *base, "--hf", str(folder), "--seed", "-3")


def test_split_takes_layout_text_as_train_does(capsys, files):
    root, folder, text = files
    base = ["train", "--hf", str(folder), "--data", str(text), "--schedule", "1f1b", "-p", "2", "--seq", "16",
            "-m", "2", "--batch", "4", "--steps", "2", "--json"]
    rc, out, err = run(capsys, *base, "--split", "E+t*2 | t+N+H")
    assert rc == 0, err
    rc, out_counts, err = run(capsys, *base, "--split", "3,3")
    assert rc == 0, err
    assert json.loads(out)["losses"] == json.loads(out_counts)["losses"]


def test_save_every_then_resume_continues_the_same_run_under_another_layout(capsys, files):
    root, folder, text = files
    base = ["train", "--hf", str(folder), "--data", str(text), "--schedule", "1f1b", "-p", "2", "--seq", "16",
            "-m", "4", "--batch", "8", "--json"]
    rc, out, err = run(capsys, *base, "--steps", "4")
    assert rc == 0, err
    straight = json.loads(out)["losses"]
    saved = root / "ckpt"
    rc, out, err = run(capsys, *base, "--steps", "3", "--save", str(saved), "--save-every", "2")
    assert rc == 0, err
    assert sorted(d.name for d in saved.iterdir()) == ["step-00000002", "step-00000003"]
    assert (saved / "step-00000003" / "hf" / "config.json").is_file()  # the HF export beside the checkpoint
    rc, out, err = run(capsys, *base, "--steps", "4", "--resume", str(saved))
    assert rc == 0, err
    res = json.loads(out)
    assert res["checkpoint"]["resumed_step"] == 3 and len(res["losses"]) == 1
    assert abs(res["losses"][0] - straight[3]) <= 1e-6 * straight[3]  # weights, Adam state and data continue
    err = fails(capsys, *base[:-1], "--steps", "3", "--resume", str(saved))
    assert "the checkpoint is at step 3 and --steps is 3" in err
    other = [a if a != "1f1b" else "gpipe" for a in base]
    rc, out, err = run(capsys, *other[:other.index("-p")], "-p", "3", *other[other.index("-p") + 2:], "--steps", "4",
                       "--resume", str(saved))
    assert rc == 0, err  # another schedule and p: the checkpoint is keyed by layer, not by rank
    assert abs(json.loads(out)["losses"][0] - straight[3]) <= 1e-5 * straight[3]


def test_pp2_dp2_losing_a_slot_at_step_3_restarts_at_pp2_as_a_run_resumed_there(capsys, files, tmp_path,
                                                                                monkeypatch):
    """test_runtime_restart.py's first test with an HF Llama: rank 3 dies at step 3 and its slot stays gone; the
    run restarts from step 2 at pp 2, m 4, and its losses are a run's resumed there, bit for bit."""
    root, folder, text = files
    monkeypatch.chdir(tmp_path)
    hf = ["train", "--hf", str(folder), "--data", str(text), "--steps", "3"]
    rc, out, err = run(capsys, *hf, *ELASTIC_LAYOUT, "--json")
    assert rc == 0, err
    full = json.loads(out)["losses"]
    monkeypatch.setenv("STAGEWISE_FAULT", LOSE_RANK_3)
    rc, out, err = run(capsys, *hf, *ELASTIC_LAYOUT, *SHRINK)
    assert rc == 0, err
    res = shrunk(out, err)
    assert res["checkpoint"]["exported"] == ["ck/step-00000003/hf"]  # the restarted attempt's, at pp 2
    assert res["losses"][:2] == full[:2]  # before the restart: the uninterrupted run's
    monkeypatch.delenv("STAGEWISE_FAULT")
    rc, out, err = run(capsys, *hf, "--schedule", "1f1b", "-p", "2", "-m", "4", "--seq", "16", "--no-memory",
                       "--resume", "ck/step-00000002", "--json")
    assert rc == 0, err
    assert res["losses"][2:] == json.loads(out)["losses"]  # from it: a run resumed there at the new layout
    assert max(abs(a - b) for a, b in zip(res["losses"], full)) < 1e-5  # the curve goes on


def test_an_hf_run_and_a_gpt_run_are_one_run_path(capsys, files, tmp_path, monkeypatch):
    """A newcomer's walk: train --hf and plain train give one result type (the same JSON, memory measured
    against the simulator's prediction), one checkpoint format, and the same flight recorder on a fault."""
    root, folder, text = files
    common = ["--schedule", "1f1b", "-p", "2", "-m", "4", "--batch", "8", "--seq", "16", "--steps", "2", "--json"]
    rc, out, err = run(capsys, "train", *common, "--layers", "2", "--d-model", "32", "--save", str(tmp_path / "g"))
    assert rc == 0, err
    gpt = json.loads(out)
    rc, out, err = run(capsys, "train", "--hf", str(folder), "--data", str(text), *common, "--save",
                       str(tmp_path / "h"))
    assert rc == 0, err
    hf = json.loads(out)
    # its ranks came from a forkserver that had imported transformers once for all of them
    from multiprocessing import forkserver

    from stagewise.cli.train_hf import RANK_IMPORTS
    from stagewise.hf.hf_run import RANK_IMPORTS as HF_RANK_IMPORTS

    assert RANK_IMPORTS == HF_RANK_IMPORTS and set(RANK_IMPORTS) <= set(forkserver._forkserver._preload_modules)
    assert set(hf) - set(gpt) == {"read_bytes_per_rank"} and set(gpt) <= set(hf)
    assert len(hf["predicted_peak_activation_bytes"]) == 2 and all(b > 0 for b in hf["peak_activation_bytes"])
    manifests = [json.loads((tmp_path / k / "step-00000002" / "manifest.json").read_text()) for k in ("g", "h")]
    assert manifests[0]["format"] == manifests[1]["format"] and manifests[1]["run"]["model"]["class"] == "HFRun"
    # only the HF run exported a folder, and its manifest lists it: what --overwrite may delete of it later
    assert "exported" not in gpt["checkpoint"] and hf["checkpoint"]["exported"] == [
        str(tmp_path / "h" / "step-00000002" / "hf")]
    export = tmp_path / "h" / "step-00000002" / "hf"
    assert set(manifests[1]["export"]) == {f.name for f in export.iterdir()} and "config.json" in manifests[1]["export"]
    (export / "notes.md").write_text("the user's")
    err = fails(capsys, "train", *common[:-1], "--layers", "2", "--d-model", "32", "--save", str(tmp_path / "h"),
                "--overwrite")
    assert "step-00000002/hf/notes.md is not a file of a checkpoint" in err and (export / "notes.md").exists()
    monkeypatch.setenv("STAGEWISE_FAULT", "raise:rank=1:action=1F1")
    rc, out, err = run(capsys, "train", "--hf", str(folder), "--data", str(text), *common[:-1])
    assert rc == 1 and "rank 1 at 1F1 (step 1): InjectedFault" in err and "flight recorder, rank 1 (failed)" in err


def test_the_reference_run_exports_its_weights_to_compare_with_a_pipelined_export(capsys, files, tmp_path):
    """Issue 44: `--schedule none --save` writes the same step folder and HF export as a pipelined run; the two
    exports hold the same tensors, and a pipeline resumes the reference's checkpoint."""
    from transformers import AutoModelForCausalLM

    root, folder, text = files
    common = ["--hf", str(folder), "--data", str(text), *TINY]
    rc, out, err = run(capsys, "train", *common, "--schedule", "none", "--save", str(tmp_path / "ref"))
    assert rc == 0 and f"saved {tmp_path / 'ref' / 'step-00000003'}" in out, err
    rc, out, err = run(capsys, "train", *common, "--schedule", "1f1b", "-p", "2", "--save", str(tmp_path / "pipe"))
    assert rc == 0, err
    ref, pipe = (AutoModelForCausalLM.from_pretrained(tmp_path / k / "step-00000003" / "hf").state_dict()
                 for k in ("ref", "pipe"))
    assert set(ref) == set(pipe)
    for name, p in pipe.items():  # Adam: near-zero gradients' rounding becomes +-lr, so a norm
        assert (ref[name] - p).norm() <= 1e-4 * p.norm(), name
    rc, out, err = run(capsys, "train", *common, "--steps", "4", "--schedule", "1f1b", "-p", "2", "--resume",
                       str(tmp_path / "ref"), "--json")  # the last --steps is argparse's
    assert rc == 0 and json.loads(out)["checkpoint"]["resumed_step"] == 3, err
