"""Pre-split micro-batches of different lengths through ``Pipeline.step(list, list)``, and the plain loops they
must equal (each micro-batch's loss weighted by its tokens).

In a module (not a test file) so spawned ranks can import the functions they run. The own model is
api_helpers' (an embedding, six Linear+Tanh layers, the tied head; split for tensor parallel by
composed_helpers' plan); the Hugging Face model is a tiny Llama.
"""

from __future__ import annotations

import torch
from torch import nn

import stagewise
from api_helpers import VOCAB, layers, loss_fn
from composed_helpers import OWN_TP_PLAN

M = 4
LENGTHS = (2, 16, 4, 8)  #: one step's micro-batch lengths: 8x apart
ROWS = 2  #: rows of each micro-batch (one per fsdp shard)
SHUFFLED_STEPS = 3
LR = 0.1


def micro_batches(lengths=LENGTHS, seed: int = 7, vocab: int = VOCAB, rows: int = ROWS) -> tuple[list, list]:
    """(inputs, targets): one (rows, length) pair of token tensors per micro-batch; a few targets ignored."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(0, vocab, (rows, n), generator=g) for n in lengths]
    ys = [torch.randint(0, vocab, (rows, n), generator=g) for n in lengths]
    ys[-1][0, 0] = -100  # an ignored target counts no token
    return xs, ys


def shuffled(step: int) -> tuple:
    """Step ``step``'s lengths: ``LENGTHS`` permuted anew each step."""
    g = torch.Generator().manual_seed(11 + step)
    return tuple(LENGTHS[k] for k in torch.randperm(M, generator=g).tolist())


def _tokens(y) -> int:
    return int((y != -100).sum())


def own_reference(steps: int = 1, lengths=None) -> list:
    """The plain model over the same micro-batches, token-weighted: per step (loss, {name: gradient}); SGD
    between steps."""
    model = nn.Sequential(*layers())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for k in range(steps):
        xs, ys = micro_batches(lengths or (shuffled(k) if steps > 1 else LENGTHS), seed=7 + k)
        total = sum(_tokens(y) for y in ys)
        loss = sum(loss_fn(model(x), y) * (_tokens(y) / total) for x, y in zip(xs, ys))
        loss.backward()
        out.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        opt.step()
        opt.zero_grad()
    return out


def hf_reference(folder: str) -> tuple:
    """transformers' own model over the micro-batches (labels = ids), token-weighted: (loss, {name: grad})."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).train()
    xs, _ = micro_batches(vocab=256)
    total = sum(x.numel() for x in xs)
    loss = sum(model(x, labels=x).loss * (x.numel() / total) for x in xs)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def run(cases, hf_folder: str, errors: dict) -> dict:
    """Rank function: each (label, family, Pipeline options) one step of ``micro_batches`` (a label ending in
    "shuffled": ``SHUFFLED_STEPS`` steps, lengths permuted each, SGD between); "llama ...": the tiny Llama.
    Rank 0 returns {label: [(loss, {name: whole gradient}) per step]}, and under "errors" what each bad input
    of ``errors`` (label -> (inputs, targets)) raised on the first case's pipeline."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    meshes = {}  # one mesh per layout, its groups made once for every case of it
    out = {}
    for label, family, options in cases:
        options = dict(options)
        layout = tuple((d, n) for d, n in options.items() if d in ("fsdp", "tp") and n > 1)
        if layout and not label.startswith("llama"):
            if layout not in meshes:
                meshes[layout] = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", layout[0][0]))
            options = {k: v for k, v in options.items() if k not in ("fsdp", "tp")}
            options["mesh"] = meshes[layout]
        if label.startswith("llama"):
            from stagewise.hf import load
            from stagewise.hf.pipelined import pipeline

            pipe = pipeline(load(hf_folder), family, microbatches=M, **options)
        else:
            if layout and layout[0][0] == "tp":
                options["tp_plan"] = OWN_TP_PLAN
            with _untagged(label.endswith("untagged")):
                pipe = stagewise.Pipeline(family, layers(), loss_fn, microbatches=M, **options)
        if not out:
            out["errors"] = _errors(pipe, errors)
            xs, ys = micro_batches()
            res = pipe.eval_step(xs, ys)
            out["eval"] = (res.loss, [tuple(o.shape) for o in res.outputs] if res.outputs is not None else None,
                           res.output_mbs)
        opt = torch.optim.SGD(pipe.parameters(), lr=LR)
        steps = SHUFFLED_STEPS if label.endswith("shuffled") else 1
        got = []
        for k in range(steps):
            if label.startswith("llama"):
                xs, _ = micro_batches(vocab=256)
                ys = xs
            else:
                xs, ys = micro_batches(shuffled(k) if steps > 1 else LENGTHS, seed=7 + k)
            loss = pipe.step(xs, ys).loss
            got.append((loss, _whole_grads(pipe)))
            opt.step()
            opt.zero_grad()
        out[label] = got
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, out)
    merged = every[0]
    merged["eval"] = [rank["eval"] for rank in every]
    for label in merged:  # each rank's gradients: a stage's, whole (sharded ones gathered)
        if label not in ("errors", "eval"):
            merged[label] = [(loss, {n: g for rank in every for n, g in rank[label][k][1].items()})
                             for k, (loss, _) in enumerate(merged[label])]
    return merged


def _untagged(on: bool):
    """Messages matched by order alone, as NCCL matches them (no tags under gloo either): each header is
    received before its data's buffer is posted, in the channel's one order."""
    from contextlib import nullcontext
    from unittest import mock

    from stagewise.runtime.messages.p2p import P2P

    class Untagged(P2P):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "tags": False})

    return mock.patch("stagewise.runtime.pipeline.P2P", Untagged) if on else nullcontext()


def _whole_grads(pipe) -> dict:
    """{original name: whole gradient} of this rank's parameters (DTensor gradients gathered: every rank of
    a stage's fsdp or tp group calls this with the same names in the same order)."""
    from stagewise.runtime.pipeline import gather_full

    return {n: g.detach().clone() for n, g in
            gather_full({n: p.grad for n, p in pipe.named_parameters() if p.grad is not None}).items()}


def _errors(pipe, errors: dict) -> dict:
    out = {}
    for label, (xs, ys) in errors.items():
        try:
            pipe.step(xs, ys)
        except stagewise.StagewiseError as e:
            out[label] = str(e)
        else:
            out[label] = None
    return out
