"""The built-in GPT and its data: deterministic, tied, the shapes the runtime and the planner rely on."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from stagewise.runtime.run.config import RunConfig, RunError
from stagewise.runtime.run.models import GPTConfig, synthetic_stream
from runtime_helpers import TINY


def test_the_same_seed_builds_the_same_weights_and_another_seed_does_not():
    a, b = TINY.layers(), TINY.layers()
    c = dataclasses.replace(TINY, seed=1).layers()
    sa, sb, sc = (nn.Sequential(*x).state_dict() for x in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["0.tok.weight"], sc["0.tok.weight"])


def test_a_layer_sequence_from_embedding_to_tied_head():
    layers = TINY.layers()
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
    with pytest.raises(RunError, match=needle):
        cfg.check()


def test_run_config_checks_before_anything_starts():
    with pytest.raises(RunError, match="--batch 10 does not split into -m 4"):
        RunConfig(schedule="1f1b", ranks=2, microbatches=4, batch=10, model=TINY).check()
    RunConfig(schedule=None, ranks=1, microbatches=4, batch=10, model=TINY).check()  # the reference takes any batch
