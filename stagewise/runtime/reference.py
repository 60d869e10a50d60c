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
from .stage import logical_names
from .worker import optimizer


def run_reference(cfg: RunConfig, report: Callable | None = None) -> dict:
    cfg.check()
    layers = cfg.model.layers()
    model = nn.Sequential(*layers)
    names = {lg: (i, n) for i, uses in enumerate(logical_names(layers)) for n, lg in uses}
    params = list(model.parameters())
    opt = optimizer(cfg, params)
    out = {"schedule": "none", "ranks": 1, "microbatches": 1, "losses": [], "step_time_s": [], "grads": None,
           "timelines": [], "measured_bubble_fraction": 0.0, "predicted_bubble_fraction": 0.0}
    for step in range(cfg.steps):
        inputs, targets = cfg.model.batch(step, cfg.batch)
        t0 = time.perf_counter()
        loss = cfg.model.loss(model(inputs), targets)
        loss.backward()
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        if step == 0 and "grads" in cfg.collect:
            out["grads"] = {lg: [_get(layers, i, n).grad.detach().numpy().copy()] for lg, (i, n) in names.items()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["step_time_s"].append(time.perf_counter() - t0)
        out["losses"].append(loss.item())
        if report:
            report(step, out["losses"][-1], out["step_time_s"][-1])
    if "params" in cfg.collect:
        out["params"] = {lg: [_get(layers, i, n).detach().numpy().copy()] for lg, (i, n) in names.items()}
    return out


def _get(layers, i: int, name: str) -> torch.Tensor:
    return layers[i].get_parameter(name)
