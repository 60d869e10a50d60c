"""Data x pipeline parallelism: dp replicas of one pipeline, their gradients summed per stage.

The ranks form a grid (mesh.py): replica d of the pipeline runs the schedule on
the ranks at dp coordinate d and takes its share of each step's batch.
Each replica's loss is divided by dp, so the sum over every rank of the
micro-batch losses is the whole batch's mean and a plain sum of gradients over
the replicas is the whole batch's gradient.

Every pipeline rank has a process group of its dp copies (every rank makes
every group, in one order). A stage's gradients are complete after its last B or
W on its rank; the executor reports each op as it ends, and the stage's
all_reduce starts right then (async, one flat buffer per dtype), so it runs
while the rank works through the rest of its program. ``finish`` waits for all
of them before the step-end collectives (tied weights, clipping).
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ...schedule import Schedule
from .mesh import Topology


class DataParallel:
    """Sums each stage's gradients over its dp copies. Mutable: the step's reductions in flight."""

    def __init__(self, topo: Topology, schedule: Schedule, stages: dict[int, torch.nn.Module], timeout_s: float):
        """Every rank makes every dp group (one per pipeline rank of every pipeline, in one order): collective.
        A stage's gradients are summed over the group of the rank that holds it."""
        self.stages = stages
        self.timeout = timedelta(seconds=timeout_s)
        mine = topo.group_of("dp")
        group = None
        for ranks in topo.groups("dp"):  # every rank, same order
            g = dist.new_group(list(ranks))
            if ranks == mine:
                group = g
        self.groups = {s: group for s in stages}
        self.pending: list = []
        self.started: list[int] = []  #: stages whose reduction started this step, in order

    def after(self, step) -> None:
        """Called by the executor after each op (a plan.Step): start the reduction of each stage whose weight
        gradients are complete (the plan's ``done``: after the stage's last B or W)."""
        for s in step.done:
            self._start(s)

    def buckets(self, s: int) -> list:
        """(parameters, group) of stage ``s``: what is summed over which ranks (ep.py sums its experts apart)."""
        return [([p for p in self.stages[s].parameters() if p.requires_grad], self.groups[s])]

    def _start(self, s: int) -> None:
        for params, group in self.buckets(s):
            for p in params:
                if p.grad is None:  # a parameter this stage did not use: its copies sum zeros
                    p.grad = torch.zeros_like(p)
            for dtype in sorted({p.dtype for p in params}, key=str):
                same = [p for p in params if p.dtype == dtype]
                flat = _flatten_dense_tensors([p.grad for p in same])
                work = dist.all_reduce(flat, group=group, async_op=True)
                self.pending.append((work, flat, same))
        self.started.append(s)

    def finish(self) -> None:
        """Wait for every reduction of the step; each gradient becomes the sum over the replicas."""
        for work, flat, params in self.pending:
            work.wait(self.timeout)
            for p, g in zip(params, _unflatten_dense_tensors(flat, [p.grad for p in params])):
                p.grad.copy_(g)
        self.pending, self.started = [], []
