"""The built-in GPT and its data: deterministic, tied, the shapes the runtime and the planner rely on."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch import nn

from stagewise.runtime.config import RunConfig, RunError
from stagewise.runtime.run.models import GPTConfig, synthetic_stream
from cli_helpers import raises_said
from runtime_helpers import TINY


def test_the_same_seed_builds_the_same_weights_and_another_seed_does_not():
    a, b = TINY.layers().build_all(), TINY.layers().build_all()
    c = dataclasses.replace(TINY, seed=1).layers().build_all()
    sa, sb, sc = (nn.Sequential(*x).state_dict() for x in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["0.tok.weight"], sc["0.tok.weight"])


def test_a_layer_sequence_from_embedding_to_tied_head():
    layers = TINY.layers().build_all()
    assert len(layers) == TINY.num_layers == len(TINY.layer_names()) == 8
    assert layers[-1].weight is layers[0].tok.weight
    x, y = TINY.batch(0, 4)
    h = x
    for layer in layers:
        h = layer(h)
    assert h.shape == (4, TINY.seq, TINY.vocab)
    assert TINY.loss(h, y).item() == pytest.approx(torch.log(torch.tensor(64.0)).item(), rel=0.02)


def test_batches_are_deterministic_next_token_windows():
    x, y = TINY.batch(3, 5)
    x2, y2 = TINY.batch(3, 5)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == y.shape == (5, TINY.seq) and torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(TINY.batch(4, 5)[0], x)


def test_the_synthetic_stream_has_structure_to_learn():
    s = synthetic_stream(64, 0, length=4096)
    assert int(s.min()) >= 0 and int(s.max()) < 64
    pairs = {}
    for a, b in zip(s[:-1].tolist(), s[1:].tolist()):
        pairs.setdefault(a, []).append(b)
    top = sum(max(v.count(t) for t in set(v)) for v in pairs.values())
    assert top / (len(s) - 1) > 0.8  # mostly a fixed successor


def test_a_file_is_read_as_byte_tokens(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(range(256)) * 2)
    cfg = GPTConfig(data=str(path), vocab=256, seq=8)
    cfg.check()
    x, y = cfg.batch(0, 3)
    assert torch.equal((x + 1) % 256, y)


@pytest.mark.parametrize("cfg, needle", [
    (GPTConfig(d_model=30, heads=4), "--d-model 30 must be a multiple of --heads 4"),
    (GPTConfig(layers_n=0), "--layers must be >= 1"),
    (GPTConfig(dtype="float8"), "--dtype must be one of"),
    (GPTConfig(data="/no/such/file", vocab=256), "--data /no/such/file: cannot read"),
])
def test_bad_model_options(cfg, needle):
    with raises_said(RunError, re.escape(needle)):  # `d_model` in the library, --d-model in the CLI's words
        cfg.check()


def test_run_config_checks_before_anything_starts():
    with raises_said(RunError, "--batch 10 does not split into --microbatches 4"):
        RunConfig(schedule="1f1b", ranks=2, microbatches=4, batch=10, model=TINY).check()
    RunConfig(schedule=None, ranks=1, microbatches=4, batch=10, model=TINY).check()  # the reference takes any batch


def test_the_moe_gpt_counts_its_parameters_and_writes_m_for_its_blocks():
    for kw in ({"moe_experts": 4}, {"moe_experts": 3, "moe_top_k": 1, "moe_shared": 2}):
        cfg = dataclasses.replace(TINY, **kw)
        layers = cfg.layers().build_all()
        assert cfg.parameters() == sum(p.numel() for p in nn.Sequential(*layers).parameters())
        assert cfg.symbols == ("E",) + ("m",) * cfg.layers_n + ("H",)
        assert cfg.identity()["--moe-experts"] == kw["moe_experts"]
        x, y = cfg.batch(0, 2)
        out = nn.Sequential(*layers)(x)
        logits, aux = out  # the head passes the running aux loss on
        assert logits.shape == (2, cfg.seq, cfg.vocab) and aux.dim() == 0 and aux.item() > 0
        assert cfg.loss(out, y).item() == pytest.approx(cfg.loss(logits, y).item() + aux.item(), rel=1e-6)
    assert "--moe-experts" not in TINY.identity()  # a dense model's identity is what older checkpoints recorded


@pytest.mark.parametrize("kw, needle", [({"moe_experts": 2, "moe_top_k": 3}, "`moe_top_k` 3: a token goes to at most "
                                         "`moe_experts` (2) experts"),
                                        ({"moe_experts": -1}, "`moe_experts` must be >= 0"),
                                        ({"moe_experts": 2, "moe_capacity": -1.0}, "`moe_capacity` must be a finite")])
def test_bad_moe_options_name_the_option(kw, needle):
    with pytest.raises(RunError) as e:
        dataclasses.replace(TINY, **kw).check()
    assert needle in str(e.value)
