"""A tiny Llama (grouped-query attention, rotary) and a tiny GPT-2 (tied embedding and head), pipelined.

Under every schedule family at p=2, and 1f1b / zb-v / dualpipe-v at p=4: the
loss and every gradient of step 1 equal transformers' own unpipelined
``model(input_ids, labels=...)`` forward and backward, and 3 SGD steps equal
3 steps of a plain loop on the HF model (float32). One launch per rank count.
SGD, not Adam, for the parameters: GPT-2's key bias has an analytically zero
gradient, and Adam turns its rounding noise (any summation order) into +-lr.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from hf_helpers import hf_model, save_tiny  # noqa: E402

from stagewise.hf.data import TextData  # noqa: E402
from stagewise.hf.run import HFRun  # noqa: E402
from stagewise.runtime import RunConfig  # noqa: E402
from stagewise.runtime.launch import train_many  # noqa: E402
from stagewise.schedules import names  # noqa: E402

pytestmark = pytest.mark.slow

STEPS, BATCH, SEQ, LR = 3, 8, 16, 0.1
P4 = ("1f1b", "zb-v", "dualpipe-v")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfp")
    text = root / "train.txt"
    text.write_text("Pipelines cut a model into stages; every rank runs its own program. " * 30)
    data = TextData(path=str(text), seq=SEQ)
    models = {"llama": HFRun(source=str(save_tiny("llama", root / "llama", num_hidden_layers=5)), data=data),
              "gpt2": HFRun(source=str(save_tiny("gpt2", root / "gpt2", n_layer=5)), data=data)}

    def cfg(model, name, p):
        return RunConfig(schedule=name, ranks=p, microbatches=2 * p, batch=BATCH, steps=STEPS, model=models[model],
                         lr=LR, optimizer="sgd", collect=("grads", "params"), measure_memory=False)

    jobs = {2: [(m, n) for m in models for n in names()], 4: [(m, n) for m in models for n in P4]}
    out = {}
    for p, keys in jobs.items():
        for key, res in zip(keys, train_many([cfg(m, n, p) for m, n in keys])):
            out[key + (p,)] = res
    return models, out


def plain_loop(run: HFRun):
    """transformers' model trained by hand: loss per step, step-1 gradients, final parameters (HF names)."""
    model = hf_model(Path(run.source))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses, grads = [], None
    for k in range(STEPS):
        ids, labels = run.batch(k, BATCH)
        loss = model(ids, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        if k == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def hf_named(run: HFRun, got: dict) -> dict:
    """The runtime's logical names (``layer.param``) as HF names; every copy of a tied parameter checked."""
    prefixes = run.model.prefixes
    out = {}
    for logical, copies in got.items():
        i, local = logical.split(".", 1)
        out[f"{prefixes[int(i)]}.{local}"] = copies
    return out


def assert_close(ours: dict, ref: dict, what: str, key):
    assert set(ours) == set(ref), (key, what)
    for name, copies in ours.items():
        want = ref[name].numpy()
        for c in copies:
            rel = np.linalg.norm(c - want) / max(np.linalg.norm(want), 1e-30)
            assert rel < 1e-4, (key, what, name, rel)


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_pipelined_equals_transformers(runs, model):
    models, out = runs
    losses, grads, params = plain_loop(models[model])
    checked = 0
    for key, res in out.items():
        if key[0] != model:
            continue
        np.testing.assert_allclose(res["losses"], losses, rtol=1e-4, err_msg=str(key))
        assert_close(hf_named(models[model], res["grads"]), grads, "grads", key)
        assert_close(hf_named(models[model], res["params"]), params, "params", key)
        checked += 1
    assert checked == len(names()) + len(P4)
