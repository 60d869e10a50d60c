"""Data x pipeline parallelism: dp replicas of one pipeline, their gradients summed per stage.

The ranks form a grid (mesh.py): replica d of the pipeline runs the schedule on
the ranks at dp coordinate d and takes its share of each step's batch.
Each replica's loss is divided by dp, so the sum over every rank of the
micro-batch losses is the whole batch's mean and a plain sum of gradients over
the replicas is the whole batch's gradient.

Every pipeline rank has a process group of its dp copies (grid.py's, made once).
A tensor-parallel stage's gradients are DTensors: each rank sums its own shard (its dp
copies are sharded alike). A stage's gradients are complete after its last B or
W on its rank; the lowered program's REDUCE_GRAD follows that op, and the stage's
all_reduce starts there (async, one flat buffer per dtype), so it runs
while the rank works through the rest of its program. ``finish`` waits for all
of them before the step-end collectives (tied weights, clipping). Each stage's reduction is written to the
flight recorder as it starts (``1REDUCE_GRAD``, the lowering's name).
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ...schedule import Schedule
from ..resilience.flight import NO_FLIGHT
from ..dtensor import local


class DataParallel:
    """Sums each stage's gradients over its dp copies. Mutable: the step's reductions in flight."""

    flight = NO_FLIGHT  #: the rank's flight.Recorder (the pipeline sets it)

    def __init__(self, grid, schedule: Schedule, stages: dict[int, torch.nn.Module], timeout_s: float):
        """``grid`` (grid.Grid) gives the dp group (made once there: ``pipe.group("dp")`` is the same). A stage's
        gradients are summed over the group of the rank that holds it."""
        self.stages = stages
        self.timeout = timedelta(seconds=timeout_s)
        self.groups = {s: grid.group("dp") for s in stages}
        self.pending: list = []
        self.started: list[int] = []  #: stages whose reduction started this step, in order

    def buckets(self, s: int) -> list:
        """(parameters, group) of stage ``s``: what is summed over which ranks (ep.py sums its experts apart)."""
        return [([p for p in self.stages[s].parameters() if p.requires_grad], self.groups[s])]

    def reduce(self, s: int) -> None:
        """REDUCE_GRAD (the executor's handler, where the lowered program has it: after the stage's last B or W
        under stagewise's overlap rule): start the stage's all-reduce."""
        self.flight.comm(f"{s}REDUCE_GRAD")
        for params, group in self.buckets(s):
            for p in params:
                if p.grad is None:  # a parameter this stage did not use: its copies sum zeros
                    p.grad = torch.zeros_like(p)
            for dtype in sorted({p.dtype for p in params}, key=str):
                same = [p for p in params if p.dtype == dtype]  # tensor parallel's: each rank's own shard summed
                flat = _flatten_dense_tensors([local(p.grad) for p in same])
                work = dist.all_reduce(flat, group=group, async_op=True)
                self.pending.append((work, flat, same, s))
        self.started.append(s)

    def finish(self) -> None:
        """Wait for every reduction of the step; each gradient becomes the sum over the replicas."""
        waited: dict[int, float] = {}
        for j, (work, flat, params, s) in enumerate(self.pending):
            t0 = time.perf_counter()
            work.wait(self.timeout)
            waited[s] = waited.get(s, 0.0) + time.perf_counter() - t0
            if j + 1 == len(self.pending) or self.pending[j + 1][3] != s:  # the stage's last bucket
                self.flight.done(f"{s}REDUCE_GRAD", waited[s])
            grads = [local(p.grad) for p in params]
            for t, g in zip(grads, _unflatten_dense_tensors(flat, grads)):
                t.copy_(g)
        self.pending, self.started = [], []


def zero_optimizer(params, optimizer_class, group, **defaults):
    """ZeRO-1 over ``group`` (the dp group: ``pipe.group("dp")``): torch's ``ZeroRedundancyOptimizer``, each
    replica stepping (and keeping the state of) its share of the parameters, then broadcasting them; a tensor
    parallel parameter (a DTensor) is broadcast as its local shard (the dp replicas are sharded alike), which
    torch's own broadcast of ``param.data`` cannot do."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    class ZeroOne(ZeroRedundancyOptimizer):
        def _broadcast_params_from_rank(self, rank: int):
            src = dist.distributed_c10d.get_global_rank(self.process_group, rank)
            return [dist.broadcast(local(p.data), src=src, group=self.process_group, async_op=True)
                    for group_ in self._partition_parameters()[rank] for p in group_["params"]]

    return ZeroOne(params, optimizer_class=optimizer_class, process_group=group, **defaults)
