"""Sequence slices run for real: loss and every gradient equal the unsliced, unpipelined run.

One launch per number of ranks (2 and 4) runs every case: seq1f1b and seq1f1b-zb (split backward) with k = 2
and 4 slices for the built-in GPT, a user's own causal model written on ``stagewise.kv``
(tests/slice_helpers.py; on 2 ranks, each family and k once) and an HF Llama (its labels pre-shifted:
``HFModel.shift_labels``). The 2-rank launch also measures the activation bytes each rank holds under 1f1b and
seq1f1b (k = 2, 4), which the simulator's slice memory model (``costs.slice_activation``) predicts within 15%
from the unsliced run's bytes (bytes, not time: deterministic). Single-process: a stage's sliced forward and
backward (the keys and values carried as detached leaves, their gradients handed back) equal its unsliced
ones, the token weights, and the slicing rules' messages.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from runtime_helpers import TINY, rel_err  # noqa: E402
from slice_helpers import cases_and_memory, own_layers, own_batch, own_loss, reference, sliced_cases  # noqa: E402

import stagewise  # noqa: E402
from stagewise.runtime.config import RunError  # noqa: E402
from stagewise.runtime.stages import kv  # noqa: E402
from stagewise.runtime.stages.stage import Stage  # noqa: E402
from stagewise.costs import Costs  # noqa: E402
from stagewise.runtime.execution.activation_memory import merge_added  # noqa: E402
from stagewise.runtime.run.models import GPTConfig  # noqa: E402
from stagewise.schedules import generate  # noqa: E402
from stagewise.simulate import simulate  # noqa: E402
from stagewise.timeline import metrics  # noqa: E402

M, ROWS = 2, 4
FAMILIES = ("seq1f1b", "seq1f1b-zb")
#: the memory cases: a longer sequence (keys and values a visible share), 4 micro-batches of 2 rows, 2 ranks
MEM, MEM_M, MEM_ROWS = GPTConfig(layers_n=4, d_model=32, heads=4, seq=64, vocab=64), 4, 8


def _cases(p: int, hf) -> list:
    out = [(f"gpt/{fam}/k{k}", generate(fam, p, M, slices=k), "gpt", ROWS) for fam in FAMILIES for k in (2, 4)]
    if p == 2:  # the own model: each family once, each k once
        out += [(f"own/{fam}/k{k}", generate(fam, p, M, slices=k), "own", ROWS) for fam, k in zip(FAMILIES, (2, 4))]
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
    """{p: {label: (loss, {name: gradient})}} and the memory cases' reports: one launch per number of ranks."""
    memory = [(f"k{k}", generate("seq1f1b" if k > 1 else "1f1b", 2, MEM_M, slices=k), MEM, MEM_ROWS)
              for k in (1, 2, 4)]
    two, reports = stagewise.launch(cases_and_memory, 2, _cases(2, hf), memory, threads=1, timeout=120)
    return {2: two, 4: stagewise.launch(sliced_cases, 4, _cases(4, hf), threads=1, timeout=120)}, reports


@pytest.mark.timeout(300)
def test_sliced_runs_equal_the_unpipelined_run(runs):
    runs, _ = runs
    refs = {model: reference(model, ROWS, M) for model in ("gpt", "own")}
    for p, got in runs.items():
        assert len([k for k in got if not k.startswith("hf")]) == (6 if p == 2 else 4)
        for label, (loss, grads, _) in got.items():
            model = label.split("/")[0]
            if model == "hf":
                continue
            want_loss, want = refs[model]
            assert abs(loss - want_loss) <= 1e-5 * abs(want_loss), (p, label, loss, want_loss)
            assert set(grads) == set(want), (p, label)
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
    for p, got in runs[0].items():
        for label, (got_loss, grads, _) in got.items():
            if not label.startswith("hf"):
                continue
            seen += 1
            assert abs(got_loss - loss.item()) <= 1e-5 * loss.item(), (p, label, got_loss, loss.item())
            assert set(grads) == set(want), (p, label)
            for name, g in grads.items():
                assert rel_err(g, want[name]) <= 1e-5, (p, label, name, rel_err(g, want[name]))
    assert seen == 3


@pytest.mark.timeout(300)
def test_the_slice_memory_model_predicts_the_measured_activation_bytes_within_15_percent(runs):
    reports = runs[1]
    size = [float(merge_added(reports["k1"])["F"][s]) for s in range(2)]  # one micro-batch's bytes per stage
    # the keys and values of a whole micro-batch on a stage (2 blocks each, fp32) as a share of its bytes
    kv_bytes = 2 * (MEM_ROWS // MEM_M) * MEM.seq * MEM.d_model * 4 * 2
    share = sum(kv_bytes / b for b in size) / len(size)
    one = [r["peak"] for r in reports["k1"]]
    for k in (2, 4):
        measured = [r["peak"] for r in reports[f"k{k}"]]
        sched = generate("seq1f1b", 2, MEM_M, slices=k)
        predicted = metrics(simulate(sched, Costs(activation_bytes=size, kv_share=share))).peak_activation_bytes
        for got, want in zip(measured, predicted):
            assert abs(got - want) <= 0.15 * want, (k, measured, predicted)
        assert measured[0] < one[0]  # the first rank holds less than 1f1b's whole micro-batches


def test_a_sliced_evaluation_gives_the_unsliced_models_outputs(runs):
    """After its step (weights unchanged: no optimizer), the own model's eval_step joins its slices back."""
    x, _ = own_batch(ROWS)
    with torch.no_grad():
        h = x
        for layer in own_layers():
            h = layer(h)
    labels = [k for k in runs[0][2] if k.startswith("own")]
    assert labels
    for label in labels:
        assert rel_err(runs[0][2][label][2], h) <= 1e-6, label


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


def test_a_run_config_with_slices_is_checked_before_any_rank_starts():
    from stagewise.runtime import RunConfig

    with pytest.raises(RunError, match=r"`slices` 3: the model's `seq` 16 must be a multiple of it"):
        RunConfig(schedule="seq1f1b", ranks=2, microbatches=2, slices=3, model=TINY).check()
    with pytest.raises(RunError, match=r"`slices` 2 with `recompute`"):
        RunConfig(schedule="seq1f1b", ranks=2, microbatches=2, slices=2, recompute=True, model=TINY).check()


def test_each_unit_weighs_its_share_of_the_steps_counted_tokens():
    from stagewise.runtime.stages.microbatches import scales

    shifted = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5, -100]])]  # a shifted label's last slice: one fewer
    assert scales(shifted, 1, 0) == [0.6, 0.4]
    assert scales([torch.randn(2, 3), torch.randn(2, 3)], 1, 0) == [0.5, 0.5]  # float targets: rows


@pytest.mark.parametrize("argv, needle", [
    (["--schedule", "seq1f1b", "--slices", "3", "--seq", "32"], "--slices 3: the model's --seq 32 must be a multiple"),
    (["--schedule", "1f1b", "--slices", "2"], "1f1b does not cut micro-batches into sequence slices"),
    (["--csv", "x.csv", "--slices", "2"], "--slices 2 cuts a family's micro-batches"),
])
def test_train_slices_mistakes_exit_2_naming_the_flag(capsys, argv, needle):
    from cli_helpers import fails

    assert needle in fails(capsys, "train", "-p", "2", "-m", "2", *argv)
