"""A tiny Llama (grouped-query attention, rotary) and a tiny GPT-2 (tied embedding and head) on stagewise.Pipeline.

Under every schedule family at p=2, and 1f1b / zb-v / dualpipe-v at p=4: the
loss and every gradient of step 1 equal transformers' own unpipelined
``model(input_ids, labels=...)`` forward and backward, and 3 SGD steps equal 3
steps of a plain loop on the HF model (float32). Each rank reads only its own
layers' tensors. One launch per rank count for both models (the saves ride in the one of 2 ranks).
SGD, not Adam, for the parameters: GPT-2's key bias has an analytically zero
gradient, and Adam turns its rounding noise (any summation order) into +-lr.
"""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from hf_helpers import each, pipelined_cases, save_and_logits, save_tiny  # noqa: E402
from hf_helpers import plain_loop as hf_plain_loop  # noqa: E402

import stagewise  # noqa: E402
from stagewise.hf import load  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, ROWS, SEQ, LR = 3, 8, 16, 0.1
P2 = [("gpipe", 4, None), ("1f1b", 4, None), ("interleaved-1f1b", 4, 2), ("looped-bfs", 4, 2), ("zb-h1", 4, None),
      ("zb-h2", 4, None), ("zb-v", 4, None), ("v-half", 4, None), ("v-min", 4, None), ("dualpipe", 4, None),
      ("dualpipe-v", 4, None)]
P4 = [("1f1b", 8, None), ("zb-v", 8, None), ("dualpipe-v", 8, None)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfp")
    text = root / "train.txt"
    text.write_text("Pipelines cut a model into stages; every rank runs its own program. " * 30)
    # 5 decoder layers: 8 layers, one per stage of zb-v at p=4
    return root, str(text), {"llama": save_tiny("llama", root / "llama", num_hidden_layers=5),
                             "gpt2": save_tiny("gpt2", root / "gpt2", n_layer=5)}


KINDS = ("llama", "gpt2")
SAVES = (("llama", "zb-v"), ("gpt2", "dualpipe"))


@pytest.fixture(scope="module")
def launched(setup):
    """Two launches: on 2 ranks every P2 case of both models, then each model trained a step under its SAVES
    schedule and saved; on 4 ranks every P4 case of both models. {p: {kind: pipelined_cases' result}}, and
    {kind: save_and_logits' result}."""
    root, text, folders = setup
    args = (STEPS, ROWS, SEQ, LR)
    two = stagewise.launch(each, 2, [(pipelined_cases, (str(folders[k]), text, P2, *args)) for k in KINDS]
                           + [(save_and_logits, (str(folders[k]), text, str(root / f"saved-{k}"), s, 4, SEQ))
                              for k, s in SAVES], threads=1)
    four = stagewise.launch(each, 4, [(pipelined_cases, (str(folders[k]), text, P4, *args)) for k in KINDS],
                            threads=1)
    return {2: dict(zip(KINDS, two)), 4: dict(zip(KINDS, four))}, dict(zip((k for k, _ in SAVES), two[len(KINDS):]))


def plain_loop(folder: Path, text: str):
    """transformers' model trained by hand: loss per step, step-1 gradients, final parameters (HF names)."""
    return hf_plain_loop(folder, text, STEPS, ROWS, SEQ, LR)


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(got, want, case) -> None:
    losses, grads, state, tied = got
    assert all(torch.equal(t, tied[0]) for t in tied), case  # the embedding and head copies stay bitwise equal
    want_losses, want_grads, want_state = want
    for a, b in zip(losses, want_losses, strict=True):
        assert abs(a - b) <= 1e-4 * abs(b), (case, losses, want_losses)
    assert set(grads) | {"lm_head.weight"} >= set(want_grads) and set(want_grads) >= set(grads) - {"lm_head.weight"}
    for name, copies in grads.items():
        ref = want_grads.get(name, want_grads.get("model.embed_tokens.weight"))  # a tied head: its embedding's
        for g in copies:
            assert rel(g, ref) < 1e-4, (case, name, rel(g, ref))
    assert state.keys() == want_state.keys(), case
    for name, ref in want_state.items():
        assert rel(state[name], ref) < 1e-4, (case, name)


@pytest.mark.parametrize("kind", KINDS)
def test_every_family_equals_transformers_and_reads_only_its_layers(setup, launched, kind):
    root, text, folders = setup
    want = plain_loop(folders[kind], text)
    for p, cases in ((2, P2), (4, P4)):
        got = launched[0][p][kind]
        for case in cases:
            check(got["cases"][case], want, (kind, p, case))
            assert len(got["cases"][case][3]) >= (2 if kind == "gpt2" else 0)
        model = load(folders[kind])
        for case in cases:  # each rank read exactly its own layers' tensors, never another rank's
            sched = stagewise.generate(case[0], p, case[1], case[2])
            ranges = _ranges(sched, model.num_layers)
            for r, names in enumerate(got["reads"][case]):
                mine = {i for s in sched.stages_of_rank(r) for i in ranges[s]}
                want_names = {model.source(f"{model.prefixes[i]}.{local}") for i in mine
                              for local, _ in model.layer(i, "meta").named_parameters()}
                assert set(names) == want_names, (kind, case, r)  # (a V's rank 0 reads a tied weight twice)


def test_save_then_from_pretrained_gives_the_pipelines_logits(setup, launched):
    from transformers import AutoModelForCausalLM

    root, text, folders = setup
    for kind, _ in SAVES:
        out = root / f"saved-{kind}"
        got = launched[1][kind]
        back = AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            assert rel(back(got["ids"]).logits, got["logits"]) < 1e-6, kind
        assert not torch.equal(back.state_dict()[load(out).prefixes[1] + ".mlp.c_fc.weight" if kind == "gpt2" else
                                                  "model.layers.0.mlp.up_proj.weight"],
                               AutoModelForCausalLM.from_pretrained(folders[kind]).state_dict()[
                                   "transformer.h.0.mlp.c_fc.weight" if kind == "gpt2" else
                                   "model.layers.0.mlp.up_proj.weight"])  # trained, not the start


def _ranges(sched, layers):
    from stagewise.runtime.stages.stage import stage_ranges

    return stage_ranges(sched, layers)
