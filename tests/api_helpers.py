"""A user's model and loop for the Pipeline API tests, next to the plain torch loop they must equal.

In a module (not a test file) so spawned ranks can import the functions they run.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

import stagewise

VOCAB, STEPS, LR = 16, 3, 1e-2
WIDTHS = (8, 12, 20, 6, 16, 10, 8)  # varied widths between the embedding and the tied head


class Head(nn.Module):
    """The output layer; its weight is the embedding's (a tied parameter)."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return F.linear(x, self.weight)


def layers() -> list[nn.Module]:
    """Embedding, six Linear+Tanh layers of varied widths, the tied head: 8 layers."""
    torch.manual_seed(0)
    emb = nn.Embedding(VOCAB, WIDTHS[0])
    mid = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(WIDTHS, WIDTHS[1:])]
    return [emb, *mid, Head(emb.weight)]


def loss_fn(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def batch(k: int, rows: int = 8, seq: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + k)
    x = torch.randint(0, VOCAB, (rows, seq), generator=g)
    return x, torch.randint(0, VOCAB, (rows, seq), generator=g)


def reference(accumulate: int = 1, clip: float | None = None) -> tuple[list[float], dict]:
    """The plain torch loop: losses of each step and the final state_dict."""
    model = nn.Sequential(*layers())
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for k in range(STEPS):
        for a in range(accumulate):
            x, y = batch(k * accumulate + a)
            loss = loss_fn(model(x), y)
            loss.backward()
            losses.append(loss.item())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def train_cases(cases, accumulate: int = 1, clip: float | None = None, dp: int = 1, **options) -> dict:
    """Rank function: for each (family, m, v) the user's loop through stagewise.Pipeline (with ``options``);
    rank 0 returns {case: (losses, full state_dict)}."""
    out = {}
    for name, m, v in cases:
        pipe = stagewise.Pipeline(name, layers(), loss_fn, microbatches=m, chunks=v, dp=dp, **options)
        opt = torch.optim.AdamW(pipe.parameters(), lr=LR)
        losses = []
        for k in range(STEPS):
            for a in range(accumulate):
                losses.append(pipe.step(*batch(k * accumulate + a)).loss)
            if clip is not None:
                pipe.clip_grad_norm_(clip)
            opt.step()
            opt.zero_grad()
        out[(name, m, v)] = (losses, pipe.full_state_dict())
    return out


# ---- per-rank construction: a factory that fails if asked for another rank's layer

#: interleaved-1f1b, p=2, v=2, 8 layers: stages of two layers, stage s on rank s % 2
MINE = {0: {0, 1, 4, 5}, 1: {2, 3, 6, 7}}


def factory_layer(i: int) -> nn.Module:
    """Layer i of an 8-layer MLP of varied widths, built from its own seed."""
    torch.manual_seed(i)
    widths = (6, 10, 14, 8, 12, 6, 9, 5, 3)
    return nn.Sequential(nn.Linear(widths[i], widths[i + 1]), nn.Tanh()) if i < 7 else nn.Linear(widths[i], 3)


def strict_factory_bytes() -> tuple[int, list[int]]:
    """Rank function: (parameter bytes held, layers built) with a factory that refuses other ranks' layers."""
    import torch.distributed as dist

    rank, asked = dist.get_rank(), []

    def build(i: int) -> nn.Module:
        if i not in MINE[rank]:
            raise AssertionError(f"rank {rank} was asked for layer {i}, which another rank holds")
        asked.append(i)
        return factory_layer(i)

    pipe = stagewise.Pipeline("interleaved-1f1b", stagewise.Layers(count=8, build=build), F.mse_loss,
                              microbatches=4, chunks=2)
    pipe.step(torch.randn(8, 6), torch.randn(8, 3))
    held = sum(p.numel() * p.element_size() for p in pipe.parameters())
    gathered = [None] * 2
    dist.all_gather_object(gathered, (held, sorted(asked)))
    return gathered


# ---- pytree boundaries: a dict, then a dataclass, with integer leaves, lengths changing between steps

@dataclasses.dataclass
class State:
    h: torch.Tensor
    pos: torch.Tensor  # int64 position ids: no gradient


class ToDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)

    def forward(self, ids):
        table = torch.linspace(0.5, 1.5, ids.shape[1]).unsqueeze(-1)  # a float leaf that needs no gradient
        return {"h": self.emb(ids), "pos": torch.arange(ids.shape[1]).expand_as(ids), "mask": ids > 2,
                "table": table}


class DictToState(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, d):
        h = self.lin(d["h"] * d["table"]) * d["mask"].unsqueeze(-1) + d["pos"].unsqueeze(-1) * 0.01
        return State(h=torch.tanh(h), pos=d["pos"])


class StateMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, s: State):
        return State(h=s.h + torch.tanh(self.lin(s.h)), pos=s.pos)


class StateHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(8, VOCAB)

    def forward(self, s: State):
        return self.out(s.h + (s.pos.unsqueeze(-1) == 0).float())


def tree_layers() -> list[nn.Module]:
    torch.manual_seed(1)
    return [ToDict(), DictToState(), StateMix(), StateMix(), StateMix(), StateHead()]


def tree_batch(k: int):
    return batch(k, rows=8, seq=3 + k)  # a new sequence length every step


def tree_reference() -> list[float]:
    model = nn.Sequential(*tree_layers())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for k in range(STEPS):
        loss = loss_fn(model(tree_batch(k)[0]), tree_batch(k)[1])
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def tree_train(name: str, m: int) -> list[float]:
    pipe = stagewise.Pipeline(name, tree_layers(), loss_fn, microbatches=m)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    out = []
    for k in range(STEPS):
        out.append(pipe.step(*tree_batch(k)).loss)
        opt.step()
        opt.zero_grad()
    return out


# ---- evaluation, autocast, a module with split points built on the meta device

class Net(nn.Module):
    """A user's model class: embedding, a ModuleList of blocks, a head; its forward is the layers in turn."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(4)])
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, VOCAB)

    def forward(self, ids):
        h = self.embed(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def features(real: dict) -> dict:
    """Rank function: eval_step, autocast and the meta-device module form, each against plain torch."""
    import torch.distributed as dist

    out = {}
    x, y = batch(0)
    pipe = stagewise.Pipeline("1f1b", layers(), loss_fn, microbatches=4)
    res = pipe.eval().eval_step(x, y)
    out["eval_loss"], out["eval_outputs"] = res.loss, (res.outputs, res.output_mbs)
    out["grads_after_eval"] = [p.grad for p in pipe.parameters() if p.grad is not None]
    out["bf16_loss"] = stagewise.Pipeline("1f1b", layers(), loss_fn, microbatches=4,
                                          autocast=torch.bfloat16).step(x, y).loss
    with torch.device("meta"):
        net = Net()
    pipe = stagewise.Pipeline("1f1b", net, loss_fn, microbatches=4, split=["blocks.2"])
    out["meta_devices"] = sorted({str(p.device) for p in pipe.parameters()})
    out["meta_names"] = sorted(n for n, _ in pipe.named_parameters())
    pipe.load_state_dict(real, strict=True)  # this rank's part of a whole state_dict
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    out["meta_losses"] = []
    for k in range(STEPS):
        out["meta_losses"].append(pipe.step(*batch(k)).loss)
        opt.step()
        opt.zero_grad()
    out["meta_state"] = pipe.full_state_dict()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, out)
    return gathered


# ---- what users get wrong: one rank function per mistake

class Changes(nn.Module):
    """(h, mask) for a float h; on its ``at``-th call the structure ("structure") or the mask's shape ("shape")
    differs, as a model with a data-dependent branch might do."""

    def __init__(self, how: str, at: int = 3):
        super().__init__()
        self.lin, self.how, self.at, self.calls = nn.Linear(4, 4), how, at, 0

    def forward(self, x):
        self.calls += 1
        h, mask = self.lin(x), torch.ones(x.shape[:1], dtype=torch.long)
        if self.calls == self.at:
            return (h,) if self.how == "structure" else (h, mask[:-1])
        return h, mask


class First(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, state):
        return self.lin(state[0])


def mistake(kind: str):
    """Rank function that makes the mistake ``kind``; it must fail on every rank with one clear message."""
    import torch.distributed as dist

    from stagewise import generate

    x, y = torch.randn(8, 4), torch.randn(8, 4)
    if kind in ("structure", "shape"):
        pipe = stagewise.Pipeline("1f1b", [Changes(kind), First()], F.mse_loss, microbatches=4)
        pipe.step(x, y)
    elif kind == "not a module":
        stagewise.Pipeline("1f1b", stagewise.Layers(count=2, build=lambda i: torch.zeros(4)), F.mse_loss,
                           microbatches=2)
    elif kind == "ranks":
        stagewise.Pipeline(generate("1f1b", 4, 4), [nn.Linear(4, 4) for _ in range(4)], F.mse_loss)
    elif kind == "no inputs":
        pipe = stagewise.Pipeline("1f1b", [nn.Linear(4, 4) for _ in range(2)], F.mse_loss, microbatches=2)
        pipe.step(None if dist.get_rank() == 0 else x, y)
    elif kind == "no targets":
        pipe = stagewise.Pipeline("1f1b", [nn.Linear(4, 4) for _ in range(2)], F.mse_loss, microbatches=2)
        pipe.step(x, None)
    elif kind == "batch":
        pipe = stagewise.Pipeline("1f1b", [nn.Linear(4, 4) for _ in range(2)], F.mse_loss, microbatches=3)
        pipe.step(x, y)
    elif kind == "split count":
        stagewise.Pipeline("1f1b", [nn.Linear(4, 4) for _ in range(4)], F.mse_loss, microbatches=2, split=(1, 1, 2))
    elif kind == "meta list":  # a sequence of meta-device layers, one with a bare parameter, no init=
        with torch.device("meta"):
            net = LooseNet()
        stagewise.Pipeline("1f1b", [net.a, net.b], F.mse_loss, microbatches=2)


def tied_by_name(i: int) -> nn.Module:
    """Layer i of ``layers()`` built alone: the head gets its own weight, off by one, so only the tie declared
    by name (and the start-equal broadcast from the embedding's rank) makes it the embedding's."""
    layer = layers()[i]
    if i == 7:
        layer.weight = nn.Parameter(layer.weight.detach() + 1.0)
    return layer


def train_tied_by_name(cases) -> dict:
    out = {}
    for name, m, v in cases:
        model = stagewise.Layers(count=8, build=tied_by_name, ties=(("0.weight", "7.weight"),))
        pipe = stagewise.Pipeline(name, model, loss_fn, microbatches=m, chunks=v)
        opt = torch.optim.AdamW(pipe.parameters(), lr=LR)
        losses = []
        for k in range(STEPS):
            losses.append(pipe.step(*batch(k)).loss)
            opt.step()
            opt.zero_grad()
        out[(name, m, v)] = (losses, pipe.full_state_dict())
    return out


def train_on_mesh(cases, names=("dp", "pp")) -> dict:
    """Rank function: train_cases with the replicas given as a named DeviceMesh instead of dp=: the names say
    which dimension is the pipeline, in either order."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    return train_cases(cases, mesh=mesh)


# ---- hardening: what a user gets wrong, and what a pipeline survives

class Loose(nn.Module):
    """A layer with a bare nn.Parameter (a learned position table) next to a Linear: no reset_parameters
    covers ``pos``, so on the meta device something else must initialise it."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(4))
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x + self.pos)


class LooseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Loose()
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(self.a(x))


def more_mistakes(kind: str):
    """Rank function for the mistakes of issue 17: each must fail on every rank with one clear message."""
    import torch.distributed as dist

    x, y = torch.randn(8, 4), torch.randn(8, 4)
    two = [nn.Linear(4, 4) for _ in range(2)]
    if kind == "rows":  # rank 1 passes a smaller batch of targets than rank 0
        pipe = stagewise.Pipeline("1f1b", two, F.mse_loss, microbatches=2)
        pipe.step(x, y if dist.get_rank() == 0 else y[:2])
    elif kind == "tie shapes":
        stagewise.Pipeline("1f1b", stagewise.Layers(4, lambda i: nn.Linear(4, 4), ties=(("0.weight", "3.bias"),)),
                           F.mse_loss, microbatches=2)
    elif kind == "microbatches text":
        stagewise.Pipeline("1f1b", two, F.mse_loss, microbatches="4")
    elif kind == "timeout 0":
        stagewise.Pipeline("1f1b", two, F.mse_loss, microbatches=2, timeout=0)
    elif kind == "clip -1":
        pipe = stagewise.Pipeline("1f1b", two, F.mse_loss, microbatches=2)
        pipe.step(x, y)
        pipe.clip_grad_norm_(-1)
    elif kind == "names twice":
        stagewise.Pipeline("1f1b", stagewise.Layers(2, lambda i: nn.Linear(4, 4), names=("a", "a")), F.mse_loss,
                           microbatches=2)
    elif kind == "count huge":
        stagewise.Pipeline("1f1b", stagewise.Layers(10**12, lambda i: nn.Linear(4, 4)), F.mse_loss, microbatches=2)
    elif kind == "meta bare":
        with torch.device("meta"):
            net = LooseNet()
        stagewise.Pipeline("1f1b", net, F.mse_loss, microbatches=2, split=["b"])
    elif kind == "loss not scalar":
        pipe = stagewise.Pipeline("1f1b", two, lambda o, t: (o - t) ** 2, microbatches=2)
        pipe.step(x, y)


class Dicts(nn.Module):
    """Returns an OrderedDict (what transformers' ModelOutput is) or a SimpleNamespace across the boundary."""

    def __init__(self, how: str):
        super().__init__()
        self.lin, self.how = nn.Linear(4, 4), how

    def forward(self, x):
        from collections import OrderedDict
        from types import SimpleNamespace

        h, mask = self.lin(x), torch.ones(x.shape[0], dtype=torch.long)
        return OrderedDict(h=h, mask=mask) if self.how == "ordered" else SimpleNamespace(h=h, mask=mask)


class Reads(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, tree):
        h = tree["h"] if isinstance(tree, dict) else tree.h
        mask = tree["mask"] if isinstance(tree, dict) else tree.mask
        return self.lin(h) * mask[:, None]


def survivals() -> dict:
    """Rank function: what a pipeline does after a NaN, with odd boundaries, bf16 and meta init."""
    import math

    import torch.distributed as dist

    out = {}
    x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), torch.randn(8, 4)
    poison = {"on": False}

    def nan_once(o, t):
        loss = F.mse_loss(o, t)
        return loss * float("nan") if poison["on"] else loss

    from stagewise.runtime.resilience.nonfinite import NonFiniteLoss

    for policy in ("raise", "skip"):
        pipe = stagewise.Pipeline("1f1b", [nn.Linear(4, 4) for _ in range(2)], nan_once, microbatches=2,
                                  nonfinite=policy)
        poison["on"] = True
        try:
            res = pipe.step(x, y)
            out[policy] = ("skipped", res.skipped, [p.grad for p in pipe.parameters()])
        except NonFiniteLoss as e:
            out[policy] = ("raised", str(e), [p.grad for p in pipe.parameters()])
        poison["on"] = False
        out[policy + " then"] = math.isfinite(pipe.step(x, y).loss)  # the pipeline goes on
    for how in ("ordered", "namespace"):
        torch.manual_seed(0)
        layers = [Dicts(how), Reads()]
        want = F.mse_loss(layers[1](layers[0](x)), y).item()
        out[how] = (stagewise.Pipeline("1f1b", layers, F.mse_loss, microbatches=2).step(x, y).loss, want)
    bf16 = {}
    for name in ("1f1b", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min", "dualpipe", "dualpipe-v"):
        torch.manual_seed(0)
        pipe = stagewise.Pipeline(name, layers_bf16(), F.mse_loss, microbatches=4, autocast=torch.bfloat16)
        res = pipe.step(x, y)
        mine = {n: p.grad.clone() for n, p in pipe.named_parameters()}
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)  # each rank holds its stages' gradients: the whole model's here
        bf16[name] = (res.loss, {n: g for part in every for n, g in part.items()})
    out["bf16"] = bf16
    seen = []
    with torch.device("meta"):
        net = LooseNet()
    pipe = stagewise.Pipeline("1f1b", net, F.mse_loss, microbatches=2, split=["b"],
                              init=lambda name, m: (seen.append(name), nn.init.ones_(m.pos)))
    out["init calls"] = seen
    out["params finite"] = all(torch.isfinite(p).all().item() for p in pipe.parameters())
    return out


def broken_once() -> dict:
    """Rank function (one rank: a peer of a failed step would time out and close its connections): a step
    that failed inside the program leaves the pipeline unable to step again, and says so."""
    out = {}
    x, y = torch.randn(8, 4), torch.randn(8, 4)
    calls = {"n": 0}

    def fails_once(o, t):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("a bug in the loss")
        return F.mse_loss(o, t)

    pipe = stagewise.Pipeline("1f1b", [nn.Linear(4, 4) for _ in range(2)], fails_once, microbatches=2)
    try:
        pipe.step(x, y)
    except ValueError:
        pass
    try:
        pipe.step(x, y)
    except Exception as e:  # noqa: BLE001 - what the next step says
        out["after error"] = f"{type(e).__name__}: {e}"
    return out


def layers_bf16() -> list[nn.Module]:
    return [nn.Linear(4, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 8),
            nn.Linear(8, 4), nn.Linear(4, 4)]


def state_and_plan_mistakes() -> dict:
    """Rank function (2 ranks): a Pipeline's optimizer, optimizer state and tp_plan arguments gone wrong, each
    caught and kept as its message (every rank alike), then the right ones round-tripping."""
    from stagewise.runtime import RunError

    out = {}

    def attempt(label, fn):
        try:
            fn()
            out[label] = None
        except RunError as e:
            out[label] = str(e)

    four = [nn.Linear(4, 4) for _ in range(4)]
    for label, plan in (("empty plan", {}), ("no match", {"nope": "colwise"}),
                        ("one of two", {"0": "colwise", "1": "rowwise", "head.out": "colwise"})):
        attempt(label, lambda: stagewise.Pipeline("1f1b", four, F.mse_loss, microbatches=2, tp=2, tp_plan=plan))
    pipe = stagewise.Pipeline("1f1b", [nn.Linear(4, 4) for _ in range(4)], F.mse_loss, microbatches=2)
    opt = torch.optim.AdamW(pipe.parameters(), lr=0.1)
    stray = torch.optim.SGD([nn.Parameter(torch.zeros(3))], lr=0.1)
    attempt("stray optimizer", lambda: pipe.optimizer_state_dict(stray))
    attempt("not an optimizer", lambda: pipe.optimizer_state_dict(pipe))
    good = pipe.optimizer_state_dict(opt)
    name = next(k for k in good if k.endswith(".exp_avg"))
    attempt("state 5", lambda: pipe.load_optimizer_state_dict(opt, {"state": 5}))
    attempt("not a dict", lambda: pipe.load_optimizer_state_dict(opt, 5))
    attempt("wrong shape", lambda: pipe.load_optimizer_state_dict(opt, {**good, name: torch.zeros(7)}))
    attempt("not a tensor", lambda: pipe.load_optimizer_state_dict(opt, {**good, name: "zeros"}))
    attempt("missing", lambda: pipe.load_optimizer_state_dict(opt, {k: v for k, v in good.items() if k != name}))
    attempt("round trip", lambda: pipe.load_optimizer_state_dict(opt, good))
    out["exp_avg"] = name
    return out


def late_rank(delay: float, then_startup: str) -> None:
    """Rank function: rank 1 builds its layers ``delay`` s after rank 0, with a step timeout of 1 s: the first
    pipeline waits for it (the startup allowance); the second, with ``STAGEWISE_STARTUP_S`` = ``then_startup``,
    names it."""
    import os
    import time

    import torch.distributed as dist

    def build(i):
        if dist.get_rank() == 1:
            time.sleep(delay)
        torch.manual_seed(i)
        return nn.Linear(4, 4)

    x = torch.randn(4, 4)
    pipe = stagewise.Pipeline("1f1b", stagewise.Layers(2, build), F.mse_loss, microbatches=2, timeout=1)
    pipe.step(x, x)
    os.environ["STAGEWISE_STARTUP_S"] = then_startup
    stagewise.Pipeline("1f1b", stagewise.Layers(2, build), F.mse_loss, microbatches=2, timeout=1)


def flight_messages(cases) -> dict:
    """Rank function: for each (family, m, v), one step with a flight recorder; every rank's (sends, posted
    receives) as the recorder wrote them, gathered to rank 0: {case: [(sends, posts) per rank]}."""
    import torch.distributed as dist

    from stagewise.runtime.resilience import flight

    out = {}
    for name, m, v in cases:
        rec = flight.Recorder(capacity=4096)
        pipe = stagewise.Pipeline(name, layers(), loss_fn, microbatches=m, chunks=v, flight=rec)
        pipe.step(*batch(0))
        mine = ([e.text for e in rec.entries() if e.kind == flight.SEND],
                [e.text for e in rec.entries() if e.kind == flight.POST])
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        out[(name, m, v)] = every
    return out


# ---- dropout: the masks depend on (seed, step, micro-batch, layer) only, not on the schedule

DROPOUT_SEED = 7


def dropout_layers() -> list[nn.Module]:
    """``layers()`` with dropout after each Linear+Tanh layer."""
    torch.manual_seed(0)
    emb = nn.Embedding(VOCAB, WIDTHS[0])
    mid = [nn.Sequential(nn.Linear(a, b), nn.Tanh(), nn.Dropout(0.3)) for a, b in zip(WIDTHS, WIDTHS[1:])]
    return [emb, *mid, Head(emb.weight)]


def dropout_reference(m: int) -> list[float]:
    """The plain loop over ``m`` micro-batches, each layer seeded as a Pipeline seeds it (docs/api.md)."""
    from stagewise.runtime.stages.rng import layer_seed

    layers = dropout_layers()
    opt = torch.optim.AdamW(nn.ModuleList(layers).parameters(), lr=LR)
    losses = []
    for k in range(STEPS):
        total = 0.0
        for mb, (x, y) in enumerate(zip(*(t.chunk(m) for t in batch(k)))):
            for i, layer in enumerate(layers):
                torch.manual_seed(layer_seed(DROPOUT_SEED, k, mb, i))
                x = layer(x)
            loss = loss_fn(x, y) * (1.0 / m)
            loss.backward()
            total += loss.item()
        losses.append(total)
        opt.step()
        opt.zero_grad()
    return losses


def train_dropout_cases(cases) -> dict:
    """Rank function: for each (family, m, v, recompute) the user's loop with dropout; rank 0 returns
    {case: losses}."""
    out = {}
    for name, m, v, recompute in cases:
        pipe = stagewise.Pipeline(name, dropout_layers(), loss_fn, microbatches=m, chunks=v, recompute=recompute,
                                  seed=DROPOUT_SEED)
        opt = torch.optim.AdamW(pipe.parameters(), lr=LR)
        losses = []
        for k in range(STEPS):
            losses.append(pipe.step(*batch(k)).loss)
            opt.step()
            opt.zero_grad()
        out[(name, m, v, recompute)] = losses
    return out


# ---- a tensor handed through layers unchanged (a timestep embedding), under FSDP

class TimeEmbed(nn.Module):
    def __init__(self):
        super().__init__()
        self.h, self.t = nn.Linear(4, 8), nn.Linear(1, 8)

    def forward(self, x):
        h, t = x
        return self.h(h), self.t(t)


class TimeBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h, t = x
        return torch.tanh(self.lin(h)) * t, t  # t handed on unchanged


class TimeHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 2)

    def forward(self, x):
        return self.lin(x[0])


def passthrough_runs() -> dict:
    """Rank function: the pass-through model at pp 2 x fsdp 2 and at pp 2 x dp 2, two SGD steps each; every
    rank returns {layout: (losses, the warnings it saw)}."""
    import warnings

    out = {}
    for layout in ({"fsdp": 2}, {"dp": 2}):
        with warnings.catch_warnings(record=True) as seen:
            torch.manual_seed(0)
            layers = [TimeEmbed(), TimeBlock(), TimeBlock(), TimeBlock(), TimeHead()]
            pipe = stagewise.Pipeline("1f1b", layers, F.mse_loss, microbatches=2, **layout)
            opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
            losses = []
            for k in range(2):
                g = torch.Generator().manual_seed(k)
                x = (torch.randn(8, 4, generator=g), torch.rand(8, 1, generator=g))
                losses.append(pipe.step(x, torch.randn(8, 2, generator=g)).loss)
                opt.step()
                opt.zero_grad()
        out[next(iter(layout))] = (losses, [str(w.message) for w in seen])
    return out
