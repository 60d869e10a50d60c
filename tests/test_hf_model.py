"""The adapter's layer sequence, stacked in one process, is transformers' own model.

Loss and every gradient of ``E, t * L, N, H`` equal ``model(input_ids, labels=...)``
(float32) for each covered family; a config alone gives seeded weights; other
architectures are refused by name.
"""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from hf_helpers import CONFIGS, batch, hf_model, save_tiny, write_config  # noqa: E402

from stagewise.hf import HFError, load  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {kind: save_tiny(kind, root / kind) for kind in CONFIGS}


def run_stack(model, ids):
    layers = model.layers()
    x = ids
    for layer in layers:
        x = layer(x)
    loss = model.loss(x, ids)
    loss.backward()
    return layers, x, loss


def rel(a, b) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-30))


@pytest.mark.parametrize("kind,attention", [(k, "sdpa") for k in CONFIGS] + [("llama", "eager"), ("mistral", "eager"),
                                                                              ("gpt2", "eager")])
def test_stack_equals_transformers_loss_and_grads(folders, kind, attention):
    ids = batch()
    ref = hf_model(folders[kind])
    ref.config._attn_implementation = attention
    out = ref(ids, labels=ids)
    out.loss.backward()
    model = load(folders[kind], attention=attention)
    layers, logits, loss = run_stack(model, ids)
    assert rel(logits, out.logits) < 1e-5
    assert abs(loss.item() - out.loss.item()) <= 1e-4 * abs(out.loss.item())
    ref_params = dict(ref.named_parameters())
    seen = set()
    for i, layer in enumerate(layers):
        for local, hf in model.names(i, layer).items():
            src = model.source(hf)
            seen.add(src)
            assert rel(layer.get_parameter(local).grad, ref_params[src].grad) < 1e-4, (kind, hf)
    assert seen == set(ref_params)  # every HF parameter is in the sequence


def test_llama_has_grouped_query_attention_and_the_layout(folders):
    model = load(folders["llama"])
    attn = model.layer(1).self_attn
    assert attn.k_proj.out_features * 2 == attn.q_proj.out_features  # 2 kv heads for 4 heads
    assert model.symbols == ["E", "t", "t", "t", "N", "H"] and model.num_layers == 6
    assert model.prefixes == ("model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
                              "model.norm", "lm_head")


@pytest.mark.parametrize("kind", ["gpt2", "qwen2"])
def test_tied_head_is_declared_by_name_and_starts_equal(folders, kind):
    model = load(folders[kind])
    emb, head = model.layer(0), model.layer(model.num_layers - 1)  # built apart, as on two ranks
    emb_name = model.family.token_weight
    assert model.ties == ((emb_name, "lm_head.weight"),)
    assert torch.equal(head.weight, emb.get_parameter(emb_name.removeprefix(model.prefixes[0] + ".")))
    assert "lm_head.weight" not in model.hf_state_dict({model.num_layers - 1: head})


def test_config_alone_gives_seeded_weights_and_equal_ties(tmp_path):
    raw = {**CONFIGS["gpt2"]}
    path = write_config(tmp_path / "config.json", **raw)
    a, b = load(path, seed=3), load(path, seed=3)
    for i in range(a.num_layers):
        for (n1, p1), (n2, p2) in zip(a.layer(i).named_parameters(), b.layer(i).named_parameters()):
            assert n1 == n2 and torch.equal(p1, p2)
    head = a.layer(a.num_layers - 1)
    assert torch.equal(head.weight, a.layer(0).wte.weight)
    assert torch.equal(a.layer(a.num_layers - 2).weight, torch.ones(64))  # a norm starts at 1
    other = load(path, seed=4).layer(0).wte.weight
    assert not torch.equal(other, a.layer(0).wte.weight)
    layers = a.layers()
    assert layers[-1].weight is layers[0].wte.weight  # one process: one Parameter


def test_unsupported_architecture_is_named(tmp_path):
    path = write_config(tmp_path / "config.json", model_type="bert", architectures=["BertForMaskedLM"])
    with pytest.raises(HFError, match=r"model_type 'bert' \(BertForMaskedLM\) is not supported; .*llama, mistral, "
                                      r"qwen2, qwen3.* gpt2"):
        load(path)


def test_bad_config_files(tmp_path):
    with pytest.raises(HFError, match="cannot read"):
        load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(HFError, match="not JSON"):
        load(tmp_path / "bad.json")
    with pytest.raises(HFError, match="no model_type"):
        load(write_config(tmp_path / "c.json", hidden_size=4))
    with pytest.raises(HFError, match="`dtype` .int8.: must be one of"):
        load(write_config(tmp_path / "d.json", **CONFIGS["gpt2"]), dtype="int8")
