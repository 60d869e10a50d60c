"""Data x pipeline parallelism: dp replicas of one pipeline, their gradients summed per stage.

Global rank = replica * p + pipeline rank: replica d runs the schedule on ranks
d*p .. d*p + p - 1 and takes rows d*B/dp .. (d+1)*B/dp of each step's batch.
Each replica's loss is divided by dp, so the sum over every rank of the
micro-batch losses is the whole batch's mean and a plain sum of gradients over
the replicas is the whole batch's gradient.

Every stage has a process group of its dp copies (every rank makes every
group, in stage order). A stage's gradients are complete after its last B or
W on its rank; the executor reports each op as it ends, and the stage's
all_reduce starts right then (async, one flat buffer per dtype), so it runs
while the rank works through the rest of its program. ``finish`` waits for all
of them before the step-end collectives (tied weights, clipping).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ...actions import Action, actions_of
from ...schedule import Schedule


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Where one process sits among p x dp ranks."""

    p: int  #: ranks of one pipeline
    dp: int  #: pipeline replicas
    rank: int  #: global rank

    @property
    def replica(self) -> int:
        return self.rank // self.p

    @property
    def pipe(self) -> int:
        """This rank's place in its pipeline: the rank of the schedule's programs."""
        return self.rank % self.p

    @property
    def base(self) -> int:
        """The global rank of this replica's pipeline rank 0."""
        return self.replica * self.p

    def global_rank(self, pipe: int, replica: int) -> int:
        return replica * self.p + pipe

    def share(self, batch: torch.Tensor) -> torch.Tensor:
        """This replica's rows of a step's batch."""
        return batch.chunk(self.dp)[self.replica] if self.dp > 1 else batch


def last_backward(program) -> dict[Action, int]:
    """Per stage of the program, its last action that adds weight gradients (B or W) -> stage."""
    last: dict[int, Action] = {}
    for op in program:
        for a in actions_of(op):
            if a.kind in ("B", "W"):
                last[a.stage] = a
    return {a: s for s, a in last.items()}


class DataParallel:
    """Sums each stage's gradients over its dp copies. Mutable: the step's reductions in flight."""

    def __init__(self, topo: Topology, schedule: Schedule, stages: dict[int, torch.nn.Module], timeout_s: float):
        self.stages = stages
        self.timeout = timedelta(seconds=timeout_s)
        self.groups = {}
        for s in range(schedule.stages):  # every rank, same order
            group = dist.new_group([topo.global_rank(schedule.placement[s], d) for d in range(topo.dp)])
            if s in stages:
                self.groups[s] = group
        self.ready = last_backward(schedule.programs[topo.pipe])
        self.pending: list = []
        self.started: list[int] = []  #: stages whose reduction started this step, in order

    def after(self, op) -> None:
        """Called by the executor after each op: start the reduction of a stage whose gradients are complete."""
        for a in actions_of(op):
            s = self.ready.get(a)
            if s is not None:
                self._start(s)

    def _start(self, s: int) -> None:
        params = [p for p in self.stages[s].parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # a parameter this stage did not use: its copies sum zeros
                p.grad = torch.zeros_like(p)
        for dtype in sorted({p.dtype for p in params}, key=str):
            same = [p for p in params if p.dtype == dtype]
            flat = _flatten_dense_tensors([p.grad for p in same])
            work = dist.all_reduce(flat, group=self.groups[s], async_op=True)
            self.pending.append((work, flat, same))
        self.started.append(s)

    def finish(self) -> None:
        """Wait for every reduction of the step; each gradient becomes the sum over the replicas."""
        for work, flat, params in self.pending:
            work.wait(self.timeout)
            for p, g in zip(params, _unflatten_dense_tensors(flat, [p.grad for p in params])):
                p.grad.copy_(g)
        self.pending, self.started = [], []
