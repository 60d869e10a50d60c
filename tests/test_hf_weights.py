"""Per-rank weights: a rank reads only its layers' tensors (counted), sharded folders, and saving back to HF."""

import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from hf_helpers import batch, save_tiny  # noqa: E402

from stagewise.hf import HFError, load  # noqa: E402
from stagewise.hf.model import _CHECKPOINTS  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfw")
    return {"llama": save_tiny("llama", root / "llama"), "gpt2": save_tiny("gpt2", root / "gpt2"),
            "sharded": save_tiny("llama", root / "sharded", shard="60KB")}


@pytest.fixture(autouse=True)
def fresh_counts():
    _CHECKPOINTS.clear()  # each test counts its own reads


def stored_names(folder):
    from safetensors import safe_open

    out = {}
    for f in Path(folder).glob("*.safetensors"):
        with safe_open(f, framework="pt") as h:
            out.update({k: f.name for k in h.keys()})
    return out


def test_a_rank_reads_only_its_layers(folders):
    model = load(folders["llama"])
    mine = {i: model.layer(i) for i in (2, 3)}  # decoder layers 1 and 2: one rank's share
    ck = model.checkpoint()
    wanted = sorted(h for i, m in mine.items() for h in model.names(i, m).values())
    assert sorted(ck.read_names) == wanted
    assert all(n.startswith(("model.layers.1.", "model.layers.2.")) for n in ck.read_names)
    everything = _all(folders["llama"])
    assert ck.read_bytes == sum(everything[n].numel() * 4 for n in wanted) < sum(t.numel() * 4 for t in everything.values())


def test_tied_head_reads_the_embedding_once_and_nothing_else(folders):
    model = load(folders["gpt2"])
    model.layer(model.num_layers - 1)  # the last rank's LM head
    assert model.checkpoint().read_names == ["transformer.wte.weight"]


def test_sharded_folder_loads_the_same_tensors(folders):
    assert len(set(stored_names(folders["sharded"]).values())) > 1  # really several files
    a, b = load(folders["llama"]), load(folders["sharded"])
    for i in range(a.num_layers):
        for (n, p), (_, q) in zip(a.layer(i).named_parameters(), b.layer(i).named_parameters()):
            assert torch.equal(p, q), n


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_saved_shards_load_with_from_pretrained(folders, tmp_path, kind):
    from transformers import AutoModelForCausalLM

    model = load(folders[kind])
    layers = model.layers()
    ids = batch()
    x = ids
    for layer in layers:
        x = layer(x)
    owners = [range(0, 2), range(2, model.num_layers)]  # two "ranks", each writes its own shard
    for k, rg in enumerate(owners):
        model.save_shard(tmp_path, {i: layers[i] for i in rg}, k, len(owners))
    model.write_index(tmp_path, len(owners))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(back(ids).logits, x.detach())
    assert set(index["weight_map"]) == set(stored_names(folders[kind]))  # the same names HF itself saves


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(HFError, match=r"no model.safetensors or model.safetensors.index.json;"):
        load(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(HFError, match="found pytorch_model.bin: convert to safetensors"):
        load(tmp_path)


def _variant(folders, folder, edit):
    """A copy of the tiny Llama whose tensors ``edit`` changed (a dict of name -> tensor)."""
    from safetensors.torch import save_file

    tensors = _all(folders["llama"])
    edit(tensors)
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text((folders["llama"] / "config.json").read_text())
    return folder


def test_missing_misshapen_or_integer_tensor_is_named_before_any_layer_is_built(folders, tmp_path):
    def drop(t):
        del t["model.norm.weight"]

    def shrink(t):
        t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][:10]

    def integer(t):
        t["model.layers.1.mlp.up_proj.weight"] = t["model.layers.1.mlp.up_proj.weight"].long()

    with pytest.raises(HFError, match="tensor model.norm.weight is missing"):
        load(_variant(folders, tmp_path / "drop", drop))
    with pytest.raises(HFError, match=r"shrink/model.safetensors: tensor model.embed_tokens.weight has shape "
                                      r"\(10, 64\); the config makes \(256, 64\)"):
        load(_variant(folders, tmp_path / "shrink", shrink))
    with pytest.raises(HFError, match=r"tensor model.layers.1.mlp.up_proj.weight is I64; weights must be F64, F32, "
                                      "F16, BF16"):
        load(_variant(folders, tmp_path / "int", integer))


def test_a_model_made_without_load_is_checked_before_its_first_layer(folders, tmp_path):
    """``HFModel(...)`` skips ``load``'s check; ``layer(i)`` runs it first, so a wrong tensor anywhere is refused
    from the headers before anything is built or read."""
    from stagewise.hf import HFModel

    def shrink(t):
        t["model.embed_tokens.weight"] = t["model.embed_tokens.weight"][:10]

    model = HFModel(config=load(folders["llama"]).config, folder=str(_variant(folders, tmp_path / "s", shrink)))
    with pytest.raises(HFError, match=r"model.embed_tokens.weight has shape \(10, 64\)"):
        model.layer(2)
    assert model.checkpoint().read_names == []


def _all(folder):
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))
