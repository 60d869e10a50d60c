"""Measure a Profile: per-layer F, B, I, W times and bytes, and the point-to-point link.

Needs torch. A model is the runtime's ``ModelConfig`` (``layers()``,
``batch(step, size)``, ``loss(output, target)``: what ``RunConfig.model``
holds, e.g. ``GPTConfig`` or ``LayerModel``), measured on step 0's batch. Each
layer is timed alone on the input it sees in the model, the median of
``repeats`` runs after ``warmup``. ``I`` and ``W`` use the runtime's own split
backward (stagewise.runtime.execution.split_backward), so they are the same work the
runtime does. Activation bytes are what autograd saves in the layer's forward
(counted once per storage, parameters excluded): what a stage keeps from F to
its backward (the runtime's own ``SavedBytes``, so the runtime's measured peaks
count the same way). Layers with the same structure (class and parameter shapes) are
measured once and share the numbers, unless ``each_layer``.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
from torch import nn

from ..runtime.execution.activation_memory import SavedBytes
from ..runtime.config import ModelConfig
from ..runtime.execution.split_backward import Splitter, input_grad, weight_grad
from ..plan.search import LayerProfile, Profile


def profile_model(model: ModelConfig, micro_batch_sizes: Sequence[int] = (1,), *, repeats: int = 5, warmup: int = 2,
                  device: str = "cpu", threads: int | None = None, each_layer: bool = False,
                  optimizer: str = "adamw") -> Profile:
    """Measure every layer of ``model`` at each micro-batch size; returns a Profile (no link).

    >>> prof = profile_model(GPTConfig(layers_n=2), (1, 2))  # doctest: +SKIP

    One layer is built at a time (the model's own per-rank factory, ``ModelConfig.layers()``), measured at
    every size on the input it sees in the model, and dropped: a model larger than this machine's memory
    profiles layer by layer. ``optimizer``: the torch.optim class (by name) whose step is timed per layer.
    """
    if threads:
        torch.set_num_threads(threads)
    from ..runtime.launching.allocator import keep_freed_memory

    keep_freed_memory()  # the runtime's ranks run with these allocator settings: time under the same
    dev = torch.device(device)
    spec = model.layers()
    spec.check()
    n = spec.count
    symbols = list(getattr(model, "symbols", None) or (["E"] + ["t"] * (n - 2) + ["H"] if n > 2 else ["t"] * n))
    names = _optional(model, "layer_names")
    batches = [tuple(t.to(dev) for t in model.batch(0, mbs)) for mbs in micro_batch_sizes]
    xs = [inputs for inputs, _ in batches]  # per size, the input of the layer being measured
    out, done, dtype, param_bytes = [], {}, None, []
    for i in range(n):
        layer = spec.make(i).to(dev)
        dtype = dtype or next((p.dtype for p in layer.parameters()), None)
        per = []
        for k, (_, targets) in enumerate(batches):
            key = None if each_layer else (k, _structure(layer, xs[k]))
            loss = (lambda o, t=targets: model.loss(o, t)) if i == n - 1 else None
            if key is None or key not in done:
                got = _measure_layer(layer, xs[k], loss, dev, repeats, warmup)
                if key is not None:
                    done[key] = got
            else:
                got = done[key]
            with torch.no_grad():
                nxt = layer(xs[k])
            per.append({**got, "input_bytes": _nbytes(xs[k]), "output_bytes": _nbytes(nxt)})
            xs[k] = nxt
        fields = {f: tuple(d[f] for d in per) for f in per[0]}
        okey = ("opt", i) if each_layer else ("opt", _structure(layer, torch.empty(0)))
        if okey not in done:
            done[okey] = _optimizer_time(layer, optimizer, repeats, warmup, dev)
        param_bytes.append({id_name: p.numel() * p.element_size() for id_name, p in layer.named_parameters()})
        out.append(LayerProfile(name=names[i] if names else type(layer).__name__, symbol=symbols[i],
                                param_bytes=float(sum(param_bytes[-1].values())), t_opt=done[okey], **fields))
        del layer
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": repeats, "optimizer": optimizer,
            "dtype": str(dtype or "?").replace("torch.", ""), **(_optional(model, "profile_meta") or {})}
    return Profile(model=getattr(model, "name", type(model).__name__), device=_device_name(dev),
                   micro_batch_sizes=tuple(micro_batch_sizes),
                   layers=tuple(out), tied=_tied_groups(spec, param_bytes), meta=meta)


def _optional(model, method: str):
    """``model.method()`` where the model has it (the optional members of ``ModelConfig``), else None."""
    fn = getattr(model, method, None)
    return fn() if callable(fn) else None


def _tied_groups(spec, param_bytes: list[dict]) -> tuple:
    """Parameters held by several layers: ((layer indices), bytes) per tie group of the model (by name)."""
    prefixes = {spec.prefix(i): i for i in range(spec.count)}
    out = []
    for group in spec.ties:
        where = []
        for full in group:
            parts = full.split(".")
            for k in range(len(parts) - 1, 0, -1):  # the longest layer prefix whose layer has the rest
                i, rest = prefixes.get(".".join(parts[:k])), ".".join(parts[k:])
                if i is not None and rest in param_bytes[i]:
                    where.append((i, param_bytes[i][rest]))
                    break
        idx = tuple(dict.fromkeys(i for i, _ in where))
        if len(idx) > 1:
            out.append((idx, float(where[0][1])))
    return tuple(out)


def _structure(layer: nn.Module, x: torch.Tensor):
    shapes = tuple((name, tuple(p.shape), p.dtype) for name, p in layer.named_parameters())
    return type(layer).__qualname__, shapes, tuple(x.shape), x.dtype


def _measure_layer(layer, x, loss, dev, repeats: int, warmup: int) -> dict:
    """Median F, B, I, W seconds and the activation bytes of one layer."""
    times: dict[str, list[float]] = {"t_f": [], "t_b": [], "t_i": [], "t_w": []}
    act = 0
    for k in range(warmup + repeats):
        keep = k >= warmup
        # full backward
        counter = SavedBytes()
        xin = _input(x)
        with counter.hooks(layer):
            t0 = _now(dev)
            root = _root(layer, xin, loss)
            t1 = _now(dev)
        act = counter.live
        grad = None if loss else torch.ones_like(root)
        t2 = _now(dev)
        torch.autograd.backward(root, grad)
        t3 = _now(dev)
        # split backward, as the runtime runs it
        splitter = Splitter(layer, 0)
        xin = _input(x)
        with splitter.record() as rec:
            root = _root(layer, xin, loss)
        t4 = _now(dev)
        input_grad([root], [grad], [xin] if xin.requires_grad else [], rec)
        t5 = _now(dev)
        weight_grad(rec)
        t6 = _now(dev)
        for h in splitter._handles:
            h.remove()
        layer.zero_grad(set_to_none=True)
        if keep:
            for name, dt in (("t_f", t1 - t0), ("t_b", t3 - t2), ("t_i", t5 - t4), ("t_w", t6 - t5)):
                times[name].append(dt)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["activation_bytes"] = float(act)
    out["spread"] = _spread([f + b for f, b in zip(times["t_f"], times["t_b"])])
    return out


def _spread(totals: list[float]) -> float:
    """Half of (slowest - fastest) / median of the repeats: the profile's measured spread (``LayerProfile``),
    capped at what a profile holds (``MAX_SPREAD``), so a profile made on a loaded machine still reads."""
    from ..plan.search import MAX_SPREAD

    mid = statistics.median(totals)
    return min((max(totals) - min(totals)) / (2 * mid), MAX_SPREAD) if mid > 0 else 0.0


def _optimizer_time(layer: nn.Module, name: str, repeats: int, warmup: int, dev) -> float:
    """Median seconds of one optimizer step over the layer's parameters (on a copy: weights stay)."""
    import copy

    layer = copy.deepcopy(layer)
    params = [p for p in layer.parameters() if p.requires_grad]
    if not params:
        return 0.0
    table = {n.lower(): c for n, c in vars(torch.optim).items() if isinstance(c, type)}
    if name.lower() not in table:
        raise ValueError(f"optimizer {name!r} is not in torch.optim")
    opt = table[name.lower()](params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    times = []
    for k in range(warmup + repeats):
        t0 = _now(dev)
        opt.step()
        t1 = _now(dev)
        if k >= warmup:
            times.append(t1 - t0)
    return statistics.median(times)


def _root(layer, x, loss):
    out = layer(x)
    return loss(out) if loss else out


def _input(x: torch.Tensor) -> torch.Tensor:
    x = x.detach()
    return x.requires_grad_(True) if x.is_floating_point() else x


def _now(dev: torch.device) -> float:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return time.perf_counter()


def _nbytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"
