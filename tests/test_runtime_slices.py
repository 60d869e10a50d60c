"""Sequence slices run for real: loss and every gradient equal the unsliced, unpipelined run.

One launch per number of ranks (2 and 4) runs every case: seq1f1b and seq1f1b-zb (split backward) with k = 2
and 4 slices, for the built-in GPT, a user's own causal model written on ``stagewise.kv`` (tests/slice_helpers.py)
and an HF Llama (its labels pre-shifted: ``HFModel.shift_labels``). Single-process: a stage's sliced forward
and backward (the keys and values carried as detached leaves, their gradients handed back) equal its unsliced
ones, and the slicing rules' messages.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_helpers import TINY, rel_err  # noqa: E402
from slice_helpers import own_layers, own_batch, own_loss, reference, sliced_cases  # noqa: E402

import stagewise  # noqa: E402
from stagewise.runtime.config import RunError  # noqa: E402
from stagewise.runtime.stages import kv  # noqa: E402
from stagewise.runtime.stages.stage import Stage  # noqa: E402
from stagewise.schedules import generate  # noqa: E402

M, ROWS = 2, 4
FAMILIES = ("seq1f1b", "seq1f1b-zb")


def _cases(p: int, hf) -> list:
    out = [(f"{model}/{fam}/k{k}", generate(fam, p, M, slices=k), model, ROWS)
           for model in ("gpt", "own") for fam in FAMILIES for k in (2, 4)]
    folder, text = hf
    hf_cases = (("seq1f1b", 2), ("seq1f1b-zb", 4)) if p == 2 else (("seq1f1b-zb", 2),)
    return out + [(f"hf/{fam}/k{k}", generate(fam, p, M, slices=k), "hf", ROWS, folder, text) for fam, k in hf_cases]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    pytest.importorskip("transformers")
    from hf_helpers import save_tiny

    root = tmp_path_factory.mktemp("slices")
    text = root / "train.txt"
    text.write_text("Sequence slices flow through the pipeline, each attending to the ones before it. " * 20)
    return str(save_tiny("llama", root / "llama")), str(text)


@pytest.fixture(scope="module")
def runs(hf):
    """{p: {label: (loss, {name: gradient})}}: one launch per number of ranks."""
    return {p: stagewise.launch(sliced_cases, p, _cases(p, hf), threads=1, timeout=120) for p in (2, 4)}


@pytest.mark.timeout(300)
def test_sliced_runs_equal_the_unpipelined_run(runs):
    refs = {model: reference(model, ROWS, M) for model in ("gpt", "own")}
    for p, got in runs.items():
        assert len([k for k in got if not k.startswith("hf")]) == 8
        for label, (loss, grads) in got.items():
            model = label.split("/")[0]
            if model == "hf":
                continue
            want_loss, want = refs[model]
            assert abs(loss - want_loss) <= 1e-5 * abs(want_loss), (p, label, loss, want_loss)
            assert {id(want[n]) for n in grads} == {id(g) for g in want.values()}, (p, label)  # every tensor
            for name, g in grads.items():
                assert rel_err(g, want[name]) <= 1e-5, (p, label, name, rel_err(g, want[name]))


@pytest.mark.timeout(300)
def test_a_sliced_hf_llama_equals_transformers_own_model(runs, hf):
    from hf_helpers import hf_model
    from stagewise.hf.data import TextData

    folder, text = hf
    model = hf_model(Path(folder))
    ids, labels = TextData(path=text, seq=16).batch(0, ROWS)
    loss = model(ids, labels=labels).loss
    loss.backward()
    want = {n: p.grad for n, p in model.named_parameters()}
    seen = 0
    for p, got in runs.items():
        for label, (got_loss, grads) in got.items():
            if not label.startswith("hf"):
                continue
            seen += 1
            assert abs(got_loss - loss.item()) <= 1e-5 * loss.item(), (p, label, got_loss, loss.item())
            assert set(grads) == set(want), (p, label)
            for name, g in grads.items():
                assert rel_err(g, want[name]) <= 1e-5, (p, label, name, rel_err(g, want[name]))
    assert seen == 3


def _stage_grads(stage, x, y, loss_fn, k: int) -> tuple[float, list]:
    """A stage's loss and gradients: unsliced (k = 1), or in k slices run as the executor runs them (forwards
    in order, backwards in reverse, the carried keys' and values' gradients handed back)."""
    stage.zero_grad()
    if k == 1:
        loss = loss_fn(stage(x), y)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in stage.parameters()]
    carry, losses = kv.Carry(), []
    for j, (xj, yj) in enumerate(zip(kv.cut(x, k, "inputs"), kv.cut(y, k, "targets"))):
        with kv.running(carry, j, xj.shape[1], grad=True):
            losses.append(loss_fn(stage(xj), yj) / k)
    for j in reversed(range(k)):
        tensors, grads = carry.extra(j)
        torch.autograd.backward([losses[j], *tensors], [torch.ones_like(losses[j]), *grads])
        carry.hand_back(j, [leaf.grad for leaf in carry.leaves_of(j)])
        carry.done(j)
    return sum(t.item() for t in losses), [p.grad.clone() for p in stage.parameters()]


@pytest.mark.parametrize("model", ["gpt", "own"])
def test_a_stages_sliced_forward_and_backward_equal_its_unsliced_ones(model):
    if model == "gpt":
        layers, loss_fn, (x, y) = TINY.layers().build_all(), TINY.loss, TINY.batch(0, 2)
    else:
        layers, loss_fn, (x, y) = own_layers(), own_loss, own_batch(2)
    stage = Stage(0, layers, 0)
    loss1, grads1 = _stage_grads(stage, x, y, loss_fn, 1)
    for k in (2, 4):
        loss_k, grads_k = _stage_grads(stage, x, y, loss_fn, k)
        assert abs(loss_k - loss1) <= 1e-6 * loss1
        assert max(rel_err(a, b) for a, b in zip(grads_k, grads1)) <= 1e-5


def test_outside_a_sliced_forward_the_protocol_changes_nothing():
    k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    assert kv.extend(k, v) == (k, v) and kv.offset() == 0 and kv.causal_mask(4, 4) is None
    assert kv.causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_a_sequence_the_slices_do_not_divide_is_refused_naming_the_rule():
    with pytest.raises(RunError, match=r"`slices` 4: targets has 6 tokens .* multiple of 4"):
        kv.cut(torch.zeros(2, 6, dtype=torch.long), 4, "targets")
    with pytest.raises(RunError, match=r"`slices` 2: inputs has shape \(3,\); .* needs two or more"):
        kv.cut(torch.zeros(3), 2, "inputs")
