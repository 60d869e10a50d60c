"""Bad input to the Hugging Face adapter (issue 17), as a hostile user gives it: refused by name, bounded.

Every case is tried through both interfaces a user touches: the Python API
(``stagewise.hf.load``, ``TextData.check``) must raise ``HFError`` naming the
file, config field or argument (library arguments in backticks), and
``stagewise train --hf FOLDER --data FILE`` must exit 2 with one line in the
CLI's words (``--hf``, ``--data``, ``--seq``), no traceback, before any rank
starts. The CLI cases run in one child process under a 2 GiB address-space cap
(``capped_cli``), so a model or file that used to be read without bound fails
the test with a MemoryError instead of taking the machine down, and a FIFO that
used to block fails it by the child's timeout. Categories follow the issue:
files outside the folder, hangs and unbounded memory, tracebacks instead of
messages.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from capped_cli import run_capped  # noqa: E402
from hf_helpers import CONFIGS, save_tiny  # noqa: E402

from stagewise.flags import say  # noqa: E402
from stagewise.hf import HFError, load  # noqa: E402
from stagewise.hf.data import TextData  # noqa: E402
from stagewise.hf.model import _CHECKPOINTS  # noqa: E402

SECONDS = 60  #: per CLI case, on a loaded 2-core machine: only a hang fails it
TRAIN = ["--schedule", "1f1b", "-p", "2", "-m", "2", "--batch", "2", "--seq", "16", "--steps", "1"]
INDEX = "model.safetensors.index.json"
LLAMA = {k: v for k, v in CONFIGS["llama"].items()}

#: (category, case id, --hf (under the root), --data (under the root), --tokenizer, environment, words)
#: words are in the library's terms; the CLI's line must hold them as the CLI says them (flags.py)
CASES = [
    # files outside the folder the user named
    ("outside", "index-absolute", "abs", "t.txt", None, {},
     ["abs/model.safetensors.index.json", "names '/", "an absolute path", "inside the folder"]),
    ("outside", "index-dotdot", "dotdot", "t.txt", None, {},
     ["dotdot/model.safetensors.index.json", "'../../etc/passwd'", "climbs out of the folder with '..'"]),
    ("outside", "weights-symlink-out", "link-out", "t.txt", None, {},
     ["link-out/model.safetensors is a symlink to", "outside", "copy the file in"]),
    ("outside", "config-symlink-zero", "zero-config", "t.txt", None, {},
     ["zero-config/config.json is a symlink to /dev/zero, outside"]),
    ("outside", "index-symlink-zero", "zero-index", "t.txt", None, {},
     ["zero-index/model.safetensors.index.json is a symlink to /dev/zero, outside"]),
    # what used to block forever or read without bound
    ("bounded", "hf-fifo", "fifo", "t.txt", None, {}, ["`source`", "fifo: not a regular file (a FIFO)"]),
    ("bounded", "data-fifo", "good", "fifo", None, {}, ["`data`", "fifo: not a regular file (a FIFO)"]),
    ("bounded", "hf-dev-zero", "/dev/zero", "t.txt", None, {}, ["`source` /dev/zero: not a regular file (a device)"]),
    ("bounded", "data-dev-zero", "good", "/dev/zero", None, {}, ["`data` /dev/zero: not a regular file (a device)"]),
    ("bounded", "data-symlink-zero", "good", "zero.txt", None, {}, ["`data`", "zero.txt: not a regular file"]),
    ("bounded", "weights-fifo", "st-fifo", "t.txt", None, {},
     ["st-fifo/model.safetensors: not a regular file (a FIFO)"]),
    ("bounded", "index-fifo", "index-fifo", "t.txt", None, {},
     ["index-fifo/model.safetensors.index.json: not a regular file (a FIFO)"]),
    ("bounded", "tokenizer-fifo", "good", "t.txt", "tok-fifo", {},
     ["tok-fifo/tokenizer.json: not a regular file (a FIFO)"]),
    ("bounded", "data-too-large", "good", "big.txt", None, {"STAGEWISE_MAX_FILE_BYTES": "5000"},
     ["`data`", "big.txt: more than 5000 bytes", "STAGEWISE_MAX_FILE_BYTES"]),
    ("bounded", "default-llama-6.7b", "only-llama.json", "t.txt", None, {},
     ["`source`", "only-llama.json: 6738415616 parameters", "STAGEWISE_MAX_PARAMETERS"]),
    ("bounded", "200000-layers", "layers.json", "t.txt", None, {},
     ["num_hidden_layers 200000 makes 200003 layers", "STAGEWISE_MAX_LAYERS"]),
    ("bounded", "huge-embedding", "vocab.json", "t.txt", None, {},
     ["vocab_size x hidden_size (the token embedding, the LM head) = 4096000000", "STAGEWISE_MAX_ELEMENTS"]),
    ("bounded", "lowered-limit", "good", "t.txt", None, {"STAGEWISE_MAX_PARAMETERS": "1000"},
     ["good/config.json: 143808 parameters", "over the limit of 1,000", "STAGEWISE_MAX_PARAMETERS"]),
    # configs of the wrong types or values
    ("config", "model-type-list", "c-type.json", "t.txt", None, {},
     ["model_type is ['llama']; it must be a string"]),
    ("config", "hidden-size-string", "c-hidden.json", "t.txt", None, {},
     ["hidden_size is '32'; it must be a whole number >= 1"]),
    ("config", "heads-0", "c-heads.json", "t.txt", None, {}, ["num_attention_heads is 0; it must be a whole number"]),
    ("config", "layers-negative", "c-layers.json", "t.txt", None, {},
     ["num_hidden_layers is -1; it must be a whole number >= 1"]),
    ("config", "heads-do-not-divide", "c-divide.json", "t.txt", None, {},
     ["hidden_size is 65; it must be a multiple of num_attention_heads (4)"]),
    ("config", "kv-heads", "c-kv.json", "t.txt", None, {},
     ["num_key_value_heads is 3; it must divide num_attention_heads (4)"]),
    ("config", "vocab-0", "c-vocab.json", "t.txt", None, {}, ["vocab_size is 0; it must be a whole number >= 1"]),
    ("config", "gpt2-n-embd", "c-gpt2.json", "t.txt", None, {}, ["n_embd is 66; it must be a multiple of n_head"]),
    ("config", "eps-nan", "c-eps.json", "t.txt", None, {}, ["rms_norm_eps is nan; it must be a finite number > 0"]),
    ("config", "activation", "c-act.json", "t.txt", None, {}, ["hidden_act is 'swishy'; transformers knows"]),
    ("config", "layer-types", "c-kinds.json", "t.txt", None, {},
     ["layer_types is ['full_attention']; it must list one of"]),
    ("config", "pad-token", "c-pad.json", "t.txt", None, {},
     ["pad_token_id is 999; it must be null or a token id of the vocabulary (vocab_size 256)"]),
    ("config", "odd-head-dim", "c-rotary.json", "t.txt", None, {}, ["head_dim is 15; rotary positions"]),
    ("config", "not-utf8", "c-latin1.json", "t.txt", None, {}, ["c-latin1.json: not UTF-8 text"]),
    ("config", "not-json", "c-broken.json", "t.txt", None, {}, ["c-broken.json: not JSON"]),
    ("config", "nested", "c-nested.json", "t.txt", None, {}, ["c-nested.json: not JSON this reader accepts: nested"]),
    ("config", "json-array", "c-array.json", "t.txt", None, {}, ["c-array.json: not a JSON object"]),
    ("config", "folder-without-config", "no-config", "t.txt", None, {}, ["`source`", "no-config: no config.json"]),
    # weights that are not what they claim
    ("weights", "truncated", "st-truncated", "t.txt", None, {},
     ["st-truncated/model.safetensors", "truncated"]),
    ("weights", "data-cut-short", "st-short", "t.txt", None, {},
     ["st-short/model.safetensors: the header's tensors take", "truncated"]),
    ("weights", "empty", "st-empty", "t.txt", None, {}, ["st-empty/model.safetensors: 0 bytes", "empty"]),
    ("weights", "garbage", "st-garbage", "t.txt", None, {}, ["st-garbage/model.safetensors: not a safetensors file"]),
    ("weights", "garbage-header", "st-header", "t.txt", None, {},
     ["st-header/model.safetensors: its safetensors header: not JSON"]),
    ("weights", "index-no-weight-map", "ix-none", "t.txt", None, {}, [f"ix-none/{INDEX}: no weight_map"]),
    ("weights", "index-list-weight-map", "ix-list", "t.txt", None, {},
     [f"ix-list/{INDEX}: a weight_map that is list"]),
    ("weights", "index-missing-file", "ix-missing", "t.txt", None, {},
     ["names 'model-00009-of-00009.safetensors', which is not in"]),
    ("weights", "index-wrong-file", "ix-wrong", "t.txt", None, {},
     ["puts tensor model.norm.weight in model-00001-of-00012.safetensors, which has no such tensor"]),
    ("weights", "wrong-shape", "st-shape", "t.txt", None, {},
     ["st-shape/model.safetensors: tensor model.embed_tokens.weight has shape (10, 64); the config makes (256, 64)"]),
    ("weights", "wrong-dtype", "st-dtype", "t.txt", None, {},
     ["st-dtype/model.safetensors: tensor model.norm.weight is I64; weights must be"]),
    # text and tokenizers
    ("data", "empty-data", "good", "empty.txt", None, {}, ["`data`", "empty.txt: an empty file", "`seq` tokens"]),
    ("data", "short-data", "good", "short.txt", None, {}, ["short.txt: 5 tokens; needs at least `seq` = 16"]),
    ("data", "tokenizer-garbage", "good", "t.txt", "tok-garbage", {}, ["`tokenizer`", "tok-garbage: not a tokenizer"]),
    ("data", "tokenizer-empty-object", "good", "t.txt", "tok-object", {}, ["tok-object: not a tokenizer folder"]),
    ("data", "tokenizer-not-a-folder", "good", "t.txt", "nowhere", {}, ["`tokenizer`", "nowhere: not a folder"]),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Every bad folder and file of the cases, made from one tiny Llama."""
    from safetensors.torch import load_file, save_file

    d = tmp_path_factory.mktemp("hfbad")
    good = save_tiny("llama", d / "good")
    sharded = save_tiny("llama", d / "sharded", shard="60KB")
    tensors = load_file(str(good / "model.safetensors"))
    (d / "t.txt").write_text("A pipeline keeps every rank busy when the schedule is good. " * 10)
    (d / "empty.txt").write_bytes(b"")
    (d / "short.txt").write_text("short")
    (d / "big.txt").write_text("x" * 10_000)
    os.symlink("/dev/zero", d / "zero.txt")
    os.mkfifo(d / "fifo")

    def copy(name: str, *drop: str) -> Path:
        out = d / name
        shutil.copytree(good, out)
        for f in drop:
            (out / f).unlink()
        return out

    def index(name: str, value) -> None:
        out = copy(name, "model.safetensors")
        (out / INDEX).write_text(json.dumps(value))

    names = sorted(tensors)
    index("abs", {"weight_map": {n: str(good / "model.safetensors") for n in names}})
    index("dotdot", {"weight_map": {n: "../../etc/passwd" for n in names}})
    index("ix-none", {"metadata": {}})
    index("ix-list", {"weight_map": [names]})
    index("ix-missing", {"weight_map": {n: "model-00009-of-00009.safetensors" for n in names}})
    wrong = shutil.copytree(sharded, d / "ix-wrong")
    weight_map = json.loads((wrong / INDEX).read_text())
    weight_map["weight_map"]["model.norm.weight"] = "model-00001-of-00012.safetensors"
    (wrong / INDEX).write_text(json.dumps(weight_map))
    os.symlink(good / "model.safetensors", copy("link-out", "model.safetensors") / "model.safetensors")
    os.symlink("/dev/zero", copy("zero-config", "config.json") / "config.json")
    os.symlink("/dev/zero", copy("zero-index") / INDEX)
    os.mkfifo(copy("st-fifo", "model.safetensors") / "model.safetensors")
    os.mkfifo(copy("index-fifo") / INDEX)
    (copy("no-config", "config.json"))
    whole = (good / "model.safetensors").read_bytes()
    (copy("st-truncated") / "model.safetensors").write_bytes(whole[:1000])
    (copy("st-short") / "model.safetensors").write_bytes(whole[:-100])
    (copy("st-empty") / "model.safetensors").write_bytes(b"")
    (copy("st-garbage") / "model.safetensors").write_bytes(os.urandom(5000))
    (copy("st-header") / "model.safetensors").write_bytes((40).to_bytes(8, "little") + b"x" * 40 + b"\0" * 64)
    save_file({**tensors, "model.embed_tokens.weight": tensors["model.embed_tokens.weight"][:10]},
              str(copy("st-shape") / "model.safetensors"))
    save_file({**tensors, "model.norm.weight": tensors["model.norm.weight"].long()},
              str(copy("st-dtype") / "model.safetensors"))
    for name, over in (("only-llama", {}), ("layers", {**LLAMA, "num_hidden_layers": 200000}),
                       ("vocab", {**LLAMA, "vocab_size": 64_000_000}),
                       ("c-type", {"model_type": ["llama"]}), ("c-hidden", {**LLAMA, "hidden_size": "32"}),
                       ("c-heads", {**LLAMA, "num_attention_heads": 0}), ("c-layers", {**LLAMA, "num_hidden_layers": -1}),
                       ("c-divide", {**LLAMA, "hidden_size": 65}), ("c-kv", {**LLAMA, "num_key_value_heads": 3}),
                       ("c-vocab", {**LLAMA, "vocab_size": 0}), ("c-gpt2", {**CONFIGS["gpt2"], "n_embd": 66}),
                       ("c-eps", {**LLAMA, "rms_norm_eps": float("nan")}), ("c-act", {**LLAMA, "hidden_act": "swishy"}),
                       ("c-kinds", {**CONFIGS["qwen2"], "layer_types": ["full_attention"]}),
                       ("c-pad", {**LLAMA, "pad_token_id": 999}), ("c-rotary", {**LLAMA, "head_dim": 15})):
        (d / f"{name}.json").write_text(json.dumps({"model_type": "llama", **over}))
    (d / "c-latin1.json").write_bytes(b'{"model_type": "llama", "name": "caf\xe9"}')
    (d / "c-broken.json").write_text('{"model_type": "llama",')
    (d / "c-nested.json").write_text("[" * 100_000)
    (d / "c-array.json").write_text("[1, 2]")
    for name, text in (("tok-garbage", "garbage"), ("tok-object", "{}")):
        (d / name).mkdir()
        (d / name / "tokenizer.json").write_text(text)
    (d / "tok-fifo").mkdir()
    os.mkfifo(d / "tok-fifo" / "tokenizer.json")
    return d


def _path(root: Path, name: str | None) -> str | None:
    return None if name is None else name if name.startswith("/") else str(root / name)


@pytest.fixture(scope="module")
def cli(root):
    """Every case through `stagewise train --hf`, in one child under the memory cap."""
    batch = []
    for _, _, hf, data, tok, env, _ in CASES:
        argv = ["train", "--hf", _path(root, hf), "--data", _path(root, data), *TRAIN]
        batch.append({"argv": argv + (["--tokenizer", _path(root, tok)] if tok else []), "env": env})
    return dict(zip((c[1] for c in CASES), run_capped(batch, timeout=600)))


@pytest.fixture(autouse=True)
def fresh():
    _CHECKPOINTS.clear()  # a folder's reader is cached per process: each case reads its own


def _api(root: Path, hf: str, data: str, tok: str | None) -> None:
    """What the CLI checks before ranks start, through the Python API."""
    model = load(_path(root, hf))
    TextData(path=_path(root, data), seq=16, tokenizer=_path(root, tok)).check(model.config, batch=2)


@pytest.mark.parametrize("category,name,hf,data,tok,env,words", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_api_raises_hferror_naming_it(root, monkeypatch, category, name, hf, data, tok, env, words):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(HFError) as info:
        _api(root, hf, data, tok)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("category,name,hf,data,tok,env,words", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_cli_exits_2_with_one_line_before_any_rank(cli, category, name, hf, data, tok, env, words):
    r = cli[name]
    assert r["rc"] == 2, r
    assert "Traceback" not in r["err"] and r["err"].count("\n") == 1, r["err"]
    assert r["err"].startswith("stagewise train: error: ") and "`" not in r["err"], r["err"]
    for w in words:
        assert say(w) in r["err"], (say(w), r["err"])
    assert "rank" not in r["err"].split("error: ", 1)[1], r["err"]  # refused in the launching process
    assert r["seconds"] < SECONDS, r


def test_the_cli_says_its_own_flags(cli):
    assert "--hf " in cli["hf-fifo"]["err"] and "--data " in cli["data-fifo"]["err"]
    assert "at least --seq = 16" in cli["short-data"]["err"] and "--tokenizer " in cli["tokenizer-garbage"]["err"]


def test_every_category_is_covered():
    assert {c[0] for c in CASES} == {"outside", "bounded", "config", "weights", "data"}
    assert len({c[1] for c in CASES}) == len(CASES)


def test_tokens_per_step_are_bounded_before_a_batch_is_made(root, monkeypatch):
    """``--batch 1048576 --seq 32``: the check the run's preflight calls, and ``batch`` itself, refuse it."""
    config = load(root / "good").config
    data = TextData(path=str(root / "t.txt"), seq=32)
    words = "`batch` 1048576 x `seq` 32 = 33554432 tokens: over the limit of 16,777,216 tokens per step; set " \
            "STAGEWISE_MAX_TOKENS=N"
    with pytest.raises(HFError, match=words):
        data.check(config, batch=1048576)
    with pytest.raises(HFError, match=words):
        data.batch(0, 1048576)
    monkeypatch.setenv("STAGEWISE_MAX_TOKENS", str(2 * 32))
    ids, _ = data.batch(0, 2)  # raised: the same data runs
    assert ids.shape == (2, 32)


def test_files_that_stay_inside_load(root, tmp_path):
    """Symlinks inside the folder, and a hub cache snapshot's links into its blobs/, are read."""
    inner = shutil.copytree(root / "good", tmp_path / "inner")
    (inner / "weights").mkdir()
    (inner / "model.safetensors").rename(inner / "weights" / "w.safetensors")
    os.symlink("weights/w.safetensors", inner / "model.safetensors")
    repo = tmp_path / "models--org--tiny"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(root / "good" / f, repo / "blobs" / f"sha-{f}")
        os.symlink(f"../../blobs/sha-{f}", snap / f)
    import torch

    want = load(root / "good").layer(1)
    for folder in (inner, snap):
        got = load(folder).layer(1)
        assert all(torch.equal(a, b) for a, b in zip(want.parameters(), got.parameters())), folder


def test_a_layer_of_a_model_over_the_limit_is_never_built(root, monkeypatch):
    """The limits bind ``load`` itself, so nothing is allocated; raising the limit lets the same model load."""
    monkeypatch.setenv("STAGEWISE_MAX_PARAMETERS", "1000")
    with pytest.raises(HFError, match="STAGEWISE_MAX_PARAMETERS"):
        load(root / "good")
    monkeypatch.setenv("STAGEWISE_MAX_PARAMETERS", "143808")
    assert load(root / "good").parameter_count == 143808


@pytest.mark.parametrize("over, words", [
    ({"rope_scaling": {"rope_type": "bogus", "factor": 2.0}}, "rope_scaling.rope_type is 'bogus'; transformers has "
                                                              "the rotary types default, linear"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -1}}, "rope_scaling.factor is -1; it must be a finite "
                                                              "number >= 1"),
    ({"rope_scaling": "x"}, "rope_scaling is 'x'; it must be null or an object"),
    ({"rope_theta": "x"}, "rope_theta is 'x'; it must be a finite number > 0"),
    ({"torch_dtype": "float99"}, "torch_dtype is 'float99'; it must be null, \"auto\" or a floating torch dtype"),
    ({"eos_token_id": [1, "x"]}, "eos_token_id is [1, 'x']; it must be int or list[int] or null (transformers' "
                                 "LlamaConfig)"),
    ({"rope_parameters": {"rope_type": "yarn"}}, "rope_parameters is {'rope_type': 'yarn'}; transformers refuses "
                                                 "it (KeyError: \"Missing required keys"),
])
def test_a_config_transformers_refuses_is_named_by_file_and_field(tmp_path, over, words):
    """Issue 44: transformers' own validation (or its later failure inside a layer) is said as the file's field,
    its value and the rule, not in transformers' internal words."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **over}))
    with pytest.raises(HFError) as e:
        load(str(path))
    assert str(e.value).startswith(f"`source` {path}: ") and words in str(e.value), str(e.value)


def test_every_field_of_a_config_that_transformers_refuses_is_named(tmp_path):
    """The class: every field of transformers' LlamaConfig and DeepseekV3Config set to a string, a negative
    number or a list, as a hostile file would: accepted, or refused naming the file and that field, never in
    transformers' type reprs or its 'Validation error' wording."""
    import dataclasses

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    path, refused = tmp_path / "config.json", 0
    for kind in ("llama", "deepseek_v3"):
        for field in dataclasses.fields(CONFIG_MAPPING[CONFIGS[kind]["model_type"]]):
            if field.name in ("model_type", "architectures", "transformers_version"):
                continue
            for bad in ("x", -7, [1, "x"]):
                path.write_text(json.dumps({**CONFIGS[kind], field.name: bad}))
                try:
                    load(str(path))
                except HFError as e:
                    text = str(e)
                    assert text.startswith(f"`source` {path}: ") and field.name in text, (field.name, bad, text)
                    assert "<class" not in text and "Validation error" not in text, (field.name, bad, text)
                    refused += 1
    assert refused > 100
