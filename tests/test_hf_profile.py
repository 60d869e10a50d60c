"""`stagewise profile --hf` measures an HF model layer by layer, and `plan` works on it."""

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import fails, run  # noqa: E402
from hf_helpers import save_tiny, write_config  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_profile_an_hf_folder_then_plan_on_it(capsys, tmp_path):
    """The whole profile, link and per-step overhead included: the overhead runs measure the HF model itself
    on 2 local ranks (issue 17: this once died after the layers with a traceback and wrote nothing)."""
    folder = save_tiny("llama", tmp_path / "llama")
    prof = tmp_path / "p.json"
    rc, out, err = run(capsys, "profile", "--hf", str(folder), "--seq", "16", "--micro-batch-sizes", "1",
                       "--repeats", "1", "-o", str(prof))
    assert rc == 0, err
    meta = json.loads(prof.read_text())["meta"]
    assert meta["hf"]["seq"] == 16 and meta["step_overhead"]["samples"]  # measured on the runtime, this model
    assert "model.embed_tokens" in out and "lm_head" in out
    layers = json.loads(prof.read_text())["layers"]
    assert [x["symbol"] for x in layers] == ["E", "t", "t", "t", "N", "H"]
    assert [x["name"] for x in layers][:2] == ["model.embed_tokens", "model.layers.0"]
    block = layers[1]
    for light in (layers[0], layers[4]):  # embedding and norm: fewer bytes than a decoder layer
        assert light["param_bytes"] < block["param_bytes"]
    rc, out, err = run(capsys, "plan", "--profile", str(prof), "-N", "2", "-G", "8", "--top", "2",
                       "-o", str(tmp_path / "best.csv"))
    assert rc == 0, err
    assert f"--hf {folder} --seq 16 --dtype float32 --data FILE" in out


def test_profile_refuses_another_architecture(capsys, tmp_path):
    bad = write_config(tmp_path / "config.json", model_type="t5")
    assert "model_type 't5' is not supported" in fails(capsys, "profile", "--hf", str(bad), "--no-link")
