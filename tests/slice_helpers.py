"""Sequence slices at run time: an own causal model on ``stagewise.kv``, the unpipelined reference, and the rank
functions that run several cases in one launch (spawned ranks import them from here)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

OWN_D, OWN_HEADS, OWN_VOCAB, OWN_SEQ = 16, 2, 32, 8


# ---- a user's own causal model: the docs/api.md protocol (stagewise.kv)

class OwnEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(OWN_VOCAB, OWN_D), nn.Embedding(OWN_SEQ, OWN_D)

    def forward(self, ids):
        import stagewise

        pos = torch.arange(ids.shape[1], device=ids.device) + stagewise.kv.offset()  # a slice's own positions
        return self.tok(ids) + self.pos(pos)


class OwnAttention(nn.Module):
    """Hand-written causal attention (softmax of masked scores), residual, then an MLP."""

    def __init__(self):
        super().__init__()
        self.qkv, self.proj = nn.Linear(OWN_D, 3 * OWN_D), nn.Linear(OWN_D, OWN_D)
        self.mlp = nn.Sequential(nn.LayerNorm(OWN_D), nn.Linear(OWN_D, 2 * OWN_D), nn.Tanh(),
                                 nn.Linear(2 * OWN_D, OWN_D))

    def forward(self, x):
        import stagewise

        B, T, D = x.shape
        q, k, v = (t.view(B, T, OWN_HEADS, -1).transpose(1, 2) for t in self.qkv(x).split(D, dim=2))
        k, v = stagewise.kv.extend(k, v)  # the earlier slices' keys and values first
        seen = stagewise.kv.causal_mask(T, k.shape[-2], x.device)
        if seen is None:
            seen = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~seen, float("-inf"))
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(x)


def own_layer(i: int, blocks: int = 4) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(100 + i)
        if i == 0:
            return OwnEmbedding()
        return OwnAttention() if i <= blocks else nn.Linear(OWN_D, OWN_VOCAB)


def own_layers(blocks: int = 4) -> list:
    return [own_layer(i, blocks) for i in range(blocks + 2)]


def own_loss(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def own_batch(rows: int):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, OWN_VOCAB, (rows, OWN_SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


# ---- models by name: (layers or Layers, loss, (inputs, targets)); the HF one from a folder

def gpt(rows: int):
    from runtime_helpers import TINY

    return TINY.layers(), TINY.loss, TINY.batch(0, rows)


def own(rows: int):
    return own_layers(), own_loss, own_batch(rows)


MODELS = {"gpt": gpt, "own": own}


def reference(model: str, rows: int, m: int) -> tuple[float, dict]:
    """The unpipelined run: ``m`` micro-batches one after another, each's mean loss / m; (loss, grads by name)."""
    from stagewise.runtime.stages.layers import as_layers

    layers, loss_fn, (x, y) = MODELS[model](rows)
    spec = as_layers(layers)
    built = spec.build_all()
    total = 0.0
    for xs, ys in zip(x.chunk(m), y.chunk(m)):
        h = xs
        for layer in built:
            h = layer(h)
        part = loss_fn(h, ys) / m
        part.backward()
        total += part.item()
    grads, seen = {}, set()
    for i, layer in enumerate(built):  # a tied parameter under its first name, as the pipeline names it
        for n, p in layer.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                grads[f"{spec.prefix(i)}.{n}"] = p.grad.clone()
    return total, grads


def sliced_cases(cases) -> dict:
    """On every rank: for each (label, schedule, model, rows) one step of ``stagewise.Pipeline``; rank 0 gets
    {label: (loss, {name: gradient}, logits)} with every rank's gradients, and for the own model the last stage's
    outputs of an ``eval_step`` after the step (its slices joined back; else None)."""
    import torch.distributed as dist

    import stagewise

    out = {}
    for label, sched, model, rows, *hf in cases:
        if model == "hf":
            from stagewise.hf import load
            from stagewise.hf.data import TextData
            from stagewise.hf.pipelined import pipeline

            folder, text = hf
            hf_model = load(folder)
            pipe = pipeline(hf_model, sched)
            ids, labels = TextData(path=text, seq=16).batch(0, rows)
            res = pipe.step(ids, hf_model.shift_labels(labels) if sched.slices > 1 else labels)
        else:
            layers, loss_fn, (x, y) = MODELS[model](rows)
            pipe = stagewise.Pipeline(sched, layers, loss_fn)
            res = pipe.step(x, y)
        logits = pipe.eval_step(x).outputs if model == "own" else None
        mine = {n: p.grad.detach().clone() for n, p in pipe.named_parameters() if p.grad is not None}
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, (mine, logits))
        out[label] = (res.loss, {n: g for part, _ in every for n, g in part.items()},
                      next((t for _, t in every if t is not None), None))
    return out


def memory_cases(cases) -> dict:
    """On every rank: for each (label, schedule, GPTConfig, rows) one step with the activation meter on; rank 0
    gets {label: every rank's ``meter.report()``}."""
    import torch.distributed as dist

    import stagewise

    out = {}
    for label, sched, cfg, rows in cases:
        pipe = stagewise.Pipeline(sched, cfg.layers(), cfg.loss, measure_memory=True)
        pipe.step(*cfg.batch(0, rows))
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, pipe.meter.report())
        out[label] = every
    return out


def cases_and_memory(cases, memory) -> tuple[dict, dict]:
    """``sliced_cases`` and ``memory_cases`` in one launch."""
    return sliced_cases(cases), memory_cases(memory)
