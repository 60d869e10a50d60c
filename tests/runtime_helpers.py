"""Model configs for runtime tests that must fail on purpose.

They live in a module (not a test file) so spawned ranks can unpickle them.
"""

from __future__ import annotations

import io
import os
import time
from contextlib import redirect_stdout
from dataclasses import dataclass

import torch
from torch import nn

from stagewise.runtime.run.models import GPTConfig

#: the tiny GPT every runtime test uses (8 layers: 8 stages at p=4, v=2)
TINY = GPTConfig(layers_n=6, d_model=32, heads=4, seq=16, vocab=64)


class DropToken(nn.Module):
    """Identity, except that its ``at``-th call drops the last token (a shape change between stages)."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        return x[:, :-1] if self.calls == self.at else x


class Boom(nn.Module):
    """Identity until its ``at``-th call, which raises ("raise"), kills the process ("exit") or stalls ("sleep")."""

    def __init__(self, at: int, how: str):
        super().__init__()
        self.at, self.how, self.calls = at, how, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            if self.how == "raise":
                raise RuntimeError("boom on purpose")
            if self.how == "exit":
                os._exit(3)
            time.sleep(30)
        return x


@dataclass(frozen=True, kw_only=True)
class InsertedLayer(GPTConfig):
    """The GPT with one extra layer at index ``where``: DropToken ("drop") or Boom ("raise", "exit", "sleep")."""

    extra: str = "drop"
    where: int = 1
    at: int = 3

    @property
    def num_layers(self) -> int:
        return super().num_layers + 1

    def layer(self, i: int):
        if i == self.where:
            return DropToken(self.at) if self.extra == "drop" else Boom(self.at, self.extra)
        return super().layer(i if i < self.where else i - 1)


def torch_schedule_csv(cls_name: str, ranks: int, microbatches: int, chunks: int) -> str:
    """A schedule written by torch itself (its compute-only order, one CSV row per rank)."""
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    with redirect_stdout(io.StringIO()):  # it prints its steps
        ops = get_schedule_ops(getattr(schedules, cls_name), ranks, microbatches, num_stages_per_rank=chunks)
    return "\n".join(",".join("" if a is None else str(a) for a in row) for row in ops) + "\n"


def rel_err(a, b) -> float:
    """Norm-wise relative difference of two arrays."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def free_port() -> int:
    """A free loopback port for a torchrun command line in a test (torchrun's own rendezvous binds it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- an own model with the public MoE block (stagewise.MoE), and rank functions that pipeline it

MOE_D, MOE_VOCAB, MOE_SEQ = 16, 32, 8


class OwnEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(MOE_VOCAB, MOE_D)

    def forward(self, ids):
        return self.tok(ids)


class OwnMoEBlock(nn.Module):
    """A user's block: a mixing layer and the public MoE block, carrying the aux loss in the boundary pair."""

    def __init__(self, **moe):
        import stagewise

        super().__init__()
        self.mix, self.norm = nn.Linear(MOE_D, MOE_D), nn.LayerNorm(MOE_D)
        self.moe = stagewise.MoE(MOE_D, moe.pop("experts", 4), moe.pop("top_k", 2), 2 * MOE_D, **moe)

    def forward(self, x):
        from stagewise import moe

        h, aux = moe.unpack(x)
        h = h + torch.tanh(self.mix(h))
        y, a = self.moe(self.norm(h))
        return moe.pack(h + y, a if aux is None else aux + a)


class OwnHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(MOE_D, MOE_VOCAB)

    def forward(self, x):
        from stagewise import moe

        h, aux = moe.unpack(x)
        return moe.pack(self.out(h), aux)


def own_moe_layer(i: int, blocks: int = 3, seed: int = 0, **moe):
    """Layer ``i`` of the own MoE model (embedding, ``blocks`` MoE blocks, head), from its own seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 1000 + i)
        if i == 0:
            return OwnEmbedding()
        return OwnMoEBlock(**moe) if i <= blocks else OwnHead()


def own_moe_layers(blocks: int = 3, **moe):
    import functools

    import stagewise

    return stagewise.Layers(count=blocks + 2, build=functools.partial(own_moe_layer, blocks=blocks, **moe))


def own_moe_loss():
    import torch.nn.functional as F
    from stagewise import moe

    return moe.with_aux(lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()))


def own_moe_batch(rows: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, MOE_VOCAB, (rows, MOE_SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def own_moe_reference(rows: int, blocks: int = 3, **moe):
    """The unpipelined own model on the whole batch: (loss, {name: gradient})."""
    layers = own_moe_layers(blocks, **moe)
    model = nn.Sequential(*layers.build_all())
    x, y = own_moe_batch(rows)
    loss = own_moe_loss()(model(x), y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def pipelined_own_moe(cases, rows: int, blocks: int = 3, **moe) -> dict:
    """For each (label, schedule, Pipeline keywords): step 1's loss, every rank's gradients by original name and
    every rank's interleaved pairs' events; a case whose step raises a stagewise error gives its message."""
    import torch.distributed as dist

    import stagewise

    x, y = own_moe_batch(rows)
    out = {}
    for label, schedule, kw in cases:
        pipe = stagewise.Pipeline(schedule, own_moe_layers(blocks, **moe), own_moe_loss(), **kw)
        try:
            res = pipe.step(x, y)
        except stagewise.StagewiseError as e:
            out[label] = str(e)
            continue
        grads = {n: p.grad.detach().clone() for n, p in pipe.named_parameters() if p.grad is not None}
        events = [(str(pair.op), [(e.half, e.what, e.name) for e in pair.events]) for pair in pipe.last_outcome.overlaps]
        out[label] = (res.loss, _every_rank(grads), _every_rank(events))
    return out


def _every_rank(value) -> list:
    import torch.distributed as dist

    got: list = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    return got


def backward_first(pair) -> None:
    """An overlap hook of a user: the halves one after the other, backward first."""
    pair.backward.run()
    pair.forward.run()


def forward_only_hook(pair) -> None:
    """A wrong overlap hook: it forgets the backward."""
    pair.forward.run()


def resume_each(cfgs) -> list:
    """Rank function: resume each config in turn on these ranks, keeping what each refused with (every rank's
    message, gathered), so one launch tries several broken checkpoints."""
    import torch.distributed as dist

    from stagewise.runtime import RunError
    from stagewise.runtime.run.worker import Env, run_job

    env = Env(rank=dist.get_rank(), world=dist.get_world_size(), device=torch.device("cpu"), backend="gloo")
    out = []
    for cfg in cfgs:
        try:
            run_job(env, cfg)
            out.append(None)
        except RunError as e:
            out.append(str(e))
    return _every_rank(out)


def flight_collectives(cases, rows: int = 8) -> dict:
    """Rank function: for each (layout, family, m, v), one step of a Pipeline with a flight recorder (the own
    MoE model under ``ep``, api_helpers' tied model otherwise) and a measured timeline; every rank's (pipeline
    rank, collectives as (the op they were issued at or after, their text)), gathered, and the measured
    timeline's communication lanes and the timeline (on rank 0): {case: ([(pipe, [(k, text)]) per rank], lanes,
    timeline)}."""
    import api_helpers
    import stagewise
    from stagewise.runtime.resilience import flight

    out = {}
    for layout, name, m, v in cases:
        rec = flight.Recorder(capacity=4096)
        if "ep" in layout:
            pipe = stagewise.Pipeline(name, own_moe_layers(), own_moe_loss(), microbatches=m, chunks=v, flight=rec,
                                      **layout)
            x, y = own_moe_batch(rows)
        else:
            pipe = stagewise.Pipeline(name, api_helpers.layers(), api_helpers.loss_fn, microbatches=m, chunks=v,
                                      flight=rec, **layout)
            x, y = api_helpers.batch(0, rows=rows)
        rec.step(0)
        tl = pipe.step(x, y, timeline=True).timeline  # on rank 0
        k, mine = -1, []
        for e in rec.entries():
            if e.kind == flight.START:
                k += 1
            elif e.kind == flight.COMM:
                mine.append((k, e.text))
        lanes = None if tl is None else [[(c.op, str(c.action), c.start, c.end, c.exposed) for c in lane]
                                         for lane in tl.comm]
        out[(tuple(layout.items()), name, m, v)] = (_every_rank((pipe.topo.pipe, mine)), lanes, tl)
    return out
