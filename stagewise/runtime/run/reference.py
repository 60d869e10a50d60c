"""The unpipelined reference: the same layers, data and optimizer in one process, micro-batch after micro-batch.

This is the correctness oracle: every schedule's loss and gradients must equal
these. The tied weight here is one parameter used twice, as in a plain model.
The batch runs as ``microbatches`` micro-batches one after another, their
gradients accumulated, each forward seeded as a pipeline's (stages/rng.py), so
a model with dropout draws the masks every schedule draws; a batch they do not
split evenly (which no pipeline runs) runs whole.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn

from ..resilience.checkpoint_manifest import FORMAT
from .config import RunConfig, RunError
from .result import RunResult
from ..stages import pytree, rng
from ..stages.stage import Stage, logical_names
from .worker import optimizer


def run_reference(cfg: RunConfig, report: Callable | None = None) -> RunResult:
    cfg.check()
    spec = cfg.model.layers()
    layers = spec.build_all()  # one process: each tie one shared Parameter
    model = Stage(0, layers, 0)  # nn.Sequential, its layers' dropout seeded by layer (rng.py)
    m = micro_batches(cfg)
    seed = getattr(cfg.model, "seed", None)
    seed = rng.default_seed() if seed is None else seed
    names = {lg: (i, n) for i, uses in enumerate(logical_names(layers)) for n, lg in uses}
    params = list(model.parameters())
    opt = optimizer(cfg, params)
    first, info = 0, None
    if cfg.resume is not None:
        first, info = resume(cfg, spec, layers, opt)
    losses, times, grads = [], [], None
    for step in range(first, cfg.steps):
        inputs, targets = cfg.model.batch(step, cfg.batch)
        t0 = time.perf_counter()
        loss = torch.zeros((), dtype=torch.float64)
        for mb, (x, y) in enumerate(zip(pytree.split(inputs, m, "inputs"), pytree.split(targets, m, "targets"))):
            with rng.forward(seed, step, mb):
                part = cfg.model.loss(model(x), y) * (1.0 / m)  # as the executor scales it
            part.backward()
            loss += part.detach().double()
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        if step == 0 and "grads" in cfg.collect:
            grads = {lg: [_get(layers, i, n).grad.detach().numpy().copy()] for lg, (i, n) in names.items()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if report:
            report(step, losses[-1], times[-1])
    params_out = None
    if "params" in cfg.collect:
        params_out = {lg: [_get(layers, i, n).detach().numpy().copy()] for lg, (i, n) in names.items()}
    return RunResult(schedule="none", ranks=1, microbatches=m, losses=tuple(losses), first_step=first,
                     step_time_s=tuple(times),
                     measured_bubble_fraction=0.0, predicted_bubble_fraction=0.0, grads=grads, params=params_out,
                     checkpoint=info)


def micro_batches(cfg: RunConfig) -> int:
    """The micro-batches the reference runs one after another: `microbatches` where they split `batch` evenly
    (as every pipeline's do), else 1 (a pipeline refuses that batch: there is no run to match)."""
    return cfg.microbatches if cfg.batch % cfg.microbatches == 0 else 1


def resume(cfg: RunConfig, spec, layers, opt) -> tuple[int, dict]:
    """Load ``cfg.resume`` (saved under any layout) into the unpipelined model and its optimizer with torch's
    own DCP calls: the model as a module tree under its original names, ``get_state_dict`` /
    ``set_state_dict`` with the optimizer state flattened. (steps done, what it did)"""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    from ..resilience import checkpoint_files
    from ..resilience.checkpoint import incompatible, read_into
    from .worker import optimizer_class

    found = checkpoint_files.preflight(cfg, optimizer_class(cfg.optimizer).__name__, cfg.model.num_layers)
    if found.manifest["format"] != FORMAT:
        raise RunError(f"`resume` {found.folder}: a layer-keyed checkpoint of an earlier stagewise; the unpipelined "
                       "reference reads DCP checkpoints only (resume it on ranks once and save, then here)")
    params = {lg: _get(layers, i, n) for i, uses in enumerate(logical_names(layers)) for n, lg in uses}
    problem = incompatible(found.manifest, set(params), params)
    if problem:
        raise RunError(f"`resume` {found.folder}: saved from another model ({problem})")
    for name in sorted(n for n in found.manifest["files"] if checkpoint_files.is_dcp_file(n)):
        checkpoint_files.check_file(found.folder, name, found.manifest)
    tree = named_tree(spec, layers)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd, optim_sd = get_state_dict(tree, opt, options=options)
    state = {"model": model_sd, "optim": {k: v for k, v in optim_sd.items() if k.startswith("state.")}}
    read_into(found.folder, found.manifest, state, no_dist=True)  # this one process
    set_state_dict(tree, opt, model_state_dict=model_sd, optim_state_dict={**optim_sd, **state["optim"]},
                   options=options)
    step = found.manifest["step"]
    return step, {"resumed_from": str(found.folder), "resumed_step": step, "rng_restored": False,
                  "skipped": list(found.skipped)}


def named_tree(spec, layers) -> nn.Module:
    """The layers as a module tree whose names are the original model's (``model.layers.3`` ...): its
    state_dict keys are the pipeline's, for torch's own state-dict and checkpoint functions."""
    root = nn.Module()
    for i, layer in enumerate(layers):
        *path, last = spec.prefix(i).split(".")
        parent = root
        for part in path:
            if part not in parent._modules:
                parent.add_module(part, nn.Module())
            parent = parent._modules[part]
        parent.add_module(last, layer)
    return root


def _get(layers, i: int, name: str) -> torch.Tensor:
    return layers[i].get_parameter(name)
