"""Dropout under every schedule draws the unpipelined model's masks over the same micro-batches (stages/rng.py).

The module alone first (no launch): seeds per (seed, step, micro-batch, layer), torch's generator left as it
was, a layer outside a pipeline's forward untouched. Then through the interfaces users touch.

A mask depends on (seed, step, micro-batch, layer) only: every family on 2 ranks, with recomputation (the
replayed forward draws its F's masks) and split backward, equals the plain loop that seeds each layer so;
through the API (one launch) and through ``stagewise train --hf`` with a tiny GPT-2 whose dropout is on
(one launch of every family, the reference twice in this process).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

import stagewise  # noqa: E402
from api_helpers import dropout_reference, train_dropout_cases  # noqa: E402
from hf_helpers import CONFIGS  # noqa: E402
from stagewise.cli import main  # noqa: E402
from stagewise.runtime import RunConfig  # noqa: E402
from stagewise.runtime.run.train import train, train_many  # noqa: E402
from stagewise.runtime.stages import rng  # noqa: E402
from stagewise.runtime.stages.stage import Stage  # noqa: E402

M = 4

#: (family, chunks) on 2 ranks: every family
FAMILIES = [("gpipe", None), ("1f1b", None), ("interleaved-1f1b", 2), ("looped-bfs", 2), ("zb-h1", None),
            ("zb-h2", None), ("zb-v", None), ("v-half", None), ("v-min", None), ("dualpipe", None),
            ("dualpipe-v", None)]
RECOMPUTED = [("1f1b", None), ("zb-v", None), ("dualpipe", None)]  # recompute, also under split backward


def test_each_layer_of_a_forward_draws_from_its_own_seed_and_the_generator_outside_is_left_as_it_was():
    stage = Stage(0, [torch.nn.Dropout(0.5), torch.nn.Dropout(0.5)], first_layer=3)
    x = torch.ones(64)
    torch.manual_seed(1)
    before = torch.get_rng_state()
    with rng.forward(7, 2, 1):
        out = stage(x)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(rng.layer_seed(7, 2, 1, 3))  # layer 3, then layer 4 from its own seed
    first = torch.nn.Dropout(0.5)(x)
    torch.manual_seed(rng.layer_seed(7, 2, 1, 4))
    assert torch.equal(out, torch.nn.Dropout(0.5)(first))
    seeds = {rng.layer_seed(7, s, mb, i) for s in range(3) for mb in range(3) for i in range(3)}
    assert len(seeds) == 27 and all(0 <= s < 1 << 63 for s in seeds)
    torch.manual_seed(1)
    plain = stage(x)  # outside a pipeline's forward: torch's generator, as any module call
    torch.manual_seed(1)
    assert torch.equal(plain, torch.nn.Dropout(0.5)(torch.nn.Dropout(0.5)(x)))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_api_pipeline_draws_the_plain_loops_dropout_under_every_family_and_recomputation():
    cases = [(f, M, v, False) for f, v in FAMILIES] + [(f, M, v, True) for f, v in RECOMPUTED]
    got = stagewise.launch(train_dropout_cases, 2, cases, threads=1)
    want = dropout_reference(M)
    assert want != dropout_reference(M // 2)  # the masks are the micro-batches': another m draws others
    for case, losses in got.items():
        assert losses == pytest.approx(want, rel=1e-5), case


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 config.json with every dropout at 0.1, and a text to train on."""
    root = tmp_path_factory.mktemp("gpt2")
    config = root / "config.json"
    config.write_text(json.dumps({**CONFIGS["gpt2"], "embd_pdrop": 0.1, "resid_pdrop": 0.1, "attn_pdrop": 0.1}))
    text = root / "text.txt"
    text.write_text("A pipeline keeps every rank busy when the schedule is good. " * 30)
    return config, text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_hf_with_dropout_repeats_and_every_family_equals_the_reference(gpt2, capsys):
    pytest.importorskip("transformers")
    from stagewise.hf.hf_run import HFRun

    config, text = gpt2
    argv = ["train", "--hf", str(config), "--data", str(text), "--seq", "16", "--seed", "0", "--steps", "2",
            "-m", str(M), "--schedule", "none", "--json"]
    refs = []
    for _ in range(2):  # the user's command: the same losses every time
        assert main(argv) == 0
        refs.append(json.loads(capsys.readouterr().out)["losses"])
    assert refs[0] == refs[1]
    base = RunConfig(schedule="1f1b", ranks=2, microbatches=M, batch=8, steps=2, timeout=60,
                     model=HFRun(source=str(config), data=str(text), seq=16))
    assert train(dataclasses.replace(base, schedule=None)).losses == pytest.approx(refs[0], rel=1e-6)
    assert train(dataclasses.replace(base, schedule=None, microbatches=2)).losses[0] != refs[0][0]  # masks drawn
    cfgs = [dataclasses.replace(base, schedule=f, chunks=v) for f, v in FAMILIES] + \
           [dataclasses.replace(base, schedule=f, chunks=v, recompute=True) for f, v in RECOMPUTED]
    for cfg, res in zip(cfgs, train_many(cfgs)):
        assert res.losses == pytest.approx(refs[0], rel=1e-5), (cfg.schedule, cfg.recompute)
