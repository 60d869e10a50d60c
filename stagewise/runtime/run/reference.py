"""The unpipelined reference: the same layers, data and optimizer in one process, whole batch at once.

This is the correctness oracle: every schedule's loss and gradients must equal
these. The tied weight here is one parameter used twice, as in a plain model.
"""

from __future__ import annotations

import time
from typing import Callable

import torch
from torch import nn

from .config import RunConfig
from .result import RunResult
from ..stages.stage import logical_names
from .worker import optimizer


def run_reference(cfg: RunConfig, report: Callable | None = None) -> RunResult:
    cfg.check()
    layers = cfg.model.layers().build_all()  # one process: each tie one shared Parameter
    model = nn.Sequential(*layers)
    names = {lg: (i, n) for i, uses in enumerate(logical_names(layers)) for n, lg in uses}
    params = list(model.parameters())
    opt = optimizer(cfg, params)
    losses, times, grads = [], [], None
    for step in range(cfg.steps):
        inputs, targets = cfg.model.batch(step, cfg.batch)
        t0 = time.perf_counter()
        loss = cfg.model.loss(model(inputs), targets)
        loss.backward()
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
    return RunResult(schedule="none", ranks=1, microbatches=1, losses=tuple(losses), step_time_s=tuple(times),
                     measured_bubble_fraction=0.0, predicted_bubble_fraction=0.0, grads=grads, params=params_out)


def _get(layers, i: int, name: str) -> torch.Tensor:
    return layers[i].get_parameter(name)
