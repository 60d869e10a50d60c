"""Pre-split micro-batches of different lengths (``Pipeline.step(list, list)``) equal the unpipelined run.

One launch of 4 ranks: every family at pp 2 x fsdp 2 and at pp 2 x tp 2 (one named mesh per layout, its groups
made once) runs one step of micro-batches whose lengths differ 8x (2..16 tokens), whose loss and every gradient
(sharded ones gathered whole) equal the plain model's over the same micro-batches, each loss weighted by its
tokens, to 1e-5; so do the tiny Llama (transformers' own model as the reference), pp 2 x dp 2 with
recomputation, pp 4 with messages matched by order alone (as NCCL matches them; Megatron-LM #5100 deadlocked at
PP >= 4), and 3 steps whose lengths are permuted each step. The same launch gives the bad inputs' one-line
errors and an evaluation of the micro-batches; the token weights are checked alone. The lowering's headers and
the validator's proof that they cannot deadlock are tests/test_lowering_headers.py.
"""

from __future__ import annotations

import pytest
import torch

import presplit_helpers as H
from hf_helpers import save_tiny
from runtime_helpers import rel_err

import stagewise
from stagewise.schedules import generate
from stagewise.schedules.registry import whole_names
from stagewise.schedules.registry import ScheduleArgError

#: every family of whole micro-batches (a sliced family at one slice is its plain family: tests/test_slices.py)
FAMILIES_RUN = whole_names()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def families() -> list[str]:
    out = []
    for name in FAMILIES_RUN:
        try:
            generate(name, 2, H.M)
        except ScheduleArgError:
            continue
        out.append(name)
    return out


CASES = ([(f"fsdp {f}", f, {"fsdp": 2}) for f in families()] + [(f"tp {f}", f, {"tp": 2}) for f in families()]
         + [("dp 1f1b recomputed", "1f1b", {"dp": 2, "recompute": True}),
            ("llama fsdp zb-v", "zb-v", {"fsdp": 2}),
            ("pp4 interleaved-1f1b untagged", "interleaved-1f1b", {}), ("pp4 zb-v untagged", "zb-v", {}),
            ("fsdp interleaved-1f1b shuffled", "interleaved-1f1b", {"fsdp": 2})])


def bad_inputs() -> dict:
    xs, ys = H.micro_batches()
    return {
        "three of four": (xs[:3], ys[:3]),
        "targets one batch": (xs, torch.cat([y[:, :2] for y in ys])),
        "a leaf missing": ([{"ids": x, "mask": x} for x in xs[:3]] + [{"ids": xs[3]}], ys),
        "a dtype": (xs[:2] + [xs[2].int()] + xs[3:], ys),
        "rows the shards cannot split": (xs[:1] + [xs[1][:1]] + xs[2:], ys),
    }


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tiny("llama", tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def runs(llama):
    return stagewise.launch(H.run, 4, CASES, str(llama), bad_inputs(), timeout=240)


def check_equal(label: str, got: tuple, want: tuple) -> None:
    (loss, grads), (want_loss, want_grads) = got, want
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss), (label, loss, want_loss)
    assert set(grads) >= set(want_grads) - {"lm_head.weight"}, label
    for name, g in want_grads.items():
        if name in grads:
            assert rel_err(grads[name], g) <= 1e-5, (label, name, rel_err(grads[name], g))


def test_every_family_at_fsdp_and_tp_equals_the_unpipelined_run_over_the_same_micro_batches(runs):
    [want] = H.own_reference()
    for label, family, _ in CASES:  # pp 4 untagged: every header read before its data, by order alone (NCCL's)
        if not label.startswith("llama") and not label.endswith("shuffled"):
            [got] = runs[label]
            check_equal(label, got, want)
    assert {label.split(" ", 1)[1] for label, *_ in CASES if label.startswith("tp ")} == set(families())


def test_lengths_permuted_across_steps_equal_the_plain_loop_step_by_step(runs):
    want = H.own_reference(steps=H.SHUFFLED_STEPS)
    assert len({H.shuffled(k) for k in range(H.SHUFFLED_STEPS)}) == H.SHUFFLED_STEPS  # a new order each step
    for k, (got, step) in enumerate(zip(runs["fsdp interleaved-1f1b shuffled"], want)):
        check_equal(f"step {k + 1}", got, step)


def test_a_hugging_face_llama_equals_transformers_own_model(runs, llama):
    [got] = runs["llama fsdp zb-v"]
    check_equal("llama", got, H.hf_reference(str(llama)))


def test_bad_micro_batches_are_one_line_naming_the_argument_and_the_rule(runs):
    got = runs["errors"]
    assert got["three of four"] == ("`inputs` has 3 micro-batches; the schedule runs 4 (`microbatches`): pass a "
                                    "list of 4")
    assert got["targets one batch"].startswith("`inputs` is a list of micro-batches but `targets` is one batch "
                                               "(Tensor); pass both as lists of 4 micro-batches")
    assert got["a leaf missing"].startswith("`inputs[3]` lacks ['mask'] where micro-batch 0 has dict with keys "
                                            "'ids', 'mask'")
    assert got["a leaf missing"].endswith("every micro-batch has the same leaves")
    assert got["a dtype"] == ("`inputs[2]` is torch.int32 where micro-batch 0's is torch.int64; a leaf has one "
                              "dtype in every micro-batch")
    assert got["rows the shards cannot split"].startswith("`inputs[1]` has 1 rows (dimension 0 of shape (1, 16)); "
                                                          "each micro-batch needs rows that split into 2 equal")
    assert all("\n" not in text for text in got.values())


def test_evaluation_takes_the_micro_batches_and_gives_each_ones_outputs(runs):
    """``eval_step(list, list)`` before the update: the step's loss, and on a last stage's ranks one output per
    micro-batch in its own shape (its shard's row)."""
    [(want_loss, _)] = H.own_reference()
    held = [(outs, mbs) for loss, outs, mbs in runs["eval"] if outs is not None]
    assert all(abs(loss - want_loss) <= 1e-5 * want_loss for loss, *_ in runs["eval"])
    assert held and all(outs == [(1, n, H.VOCAB) for n in H.LENGTHS] and mbs == (0, 1, 2, 3) for outs, mbs in held)


def test_tokens_weigh_each_micro_batch_and_equal_ones_weigh_alike():
    """``stages/microbatches.py``: integer targets count the elements that are not -100, others their rows;
    each data shard's micro-batch counts its tokens over the step's (times the shards the pipeline divides by);
    the reference runs listed micro-batches with the same weights and one batch in equal pieces."""
    from stagewise.runtime.run.reference import micro_parts
    from stagewise.runtime.stages import microbatches

    ys = [torch.ones(2, 3, dtype=torch.long), torch.full((2, 6), -100)]
    ys[1][:, :3] = 1
    assert microbatches.weights(ys) == [6.0, 6.0]
    assert microbatches.weights([torch.randn(5, 2)]) == [5.0]
    assert microbatches.scales(ys, 2, 0) == [0.5, 0.5]  # shard 0 holds 3 of each micro-batch's 6 tokens
    assert microbatches.scales([torch.ones(2, 2, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)], 1, 0) == \
        [0.25, 0.75]
    assert microbatches.varies([torch.ones(2, 2), torch.ones(2, 3)]) and not microbatches.varies(torch.ones(4, 2))
    x = torch.arange(8).reshape(4, 2)
    assert [s for *_, s in micro_parts(x, x, 2)] == [0.5, 0.5]
    assert [s for *_, s in micro_parts([x[:1], x[1:]], [x[:1], x[1:]], 2)] == [0.25, 0.75]
