"""The executor: walk one rank's program, op by op, with real tensors.

Generic: it knows the four action kinds and the overlapped pair, never a
schedule family. What an op needs from other stages (an activation for F, a
gradient for B or I) is received before its clock starts, so a measured op
spans compute only and waiting shows up as idle time, as in the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..actions import Action, actions_of
from ..schedule import Schedule
from .comm import ACT, GRAD, P2P, MessagePlan, Route
from .split_backward import Record, Splitter, input_grad, weight_grad
from .stage import Stage


@dataclass(kw_only=True)
class RankContext:
    """What one rank runs with. Mutable only through the objects it holds (stages, p2p)."""

    rank: int
    schedule: Schedule
    plan: MessagePlan
    stages: dict[int, Stage]
    p2p: P2P
    loss: Callable  #: (output, target) -> mean loss of one micro-batch
    clock: object  #: timing.WallClock or timing.CudaClock


@dataclass(kw_only=True)
class Saved:
    """A (stage, mb) between its F and its backward. Mutable: I drops ``root``."""

    x: torch.Tensor  #: the stage input (a leaf that collects its gradient, unless the lane's first stage)
    root: torch.Tensor | None  #: stage output, or the loss on the lane's last stage
    rec: Record | None = None  #: split backward: holder outputs and, after I, their gradients


@dataclass(kw_only=True)
class StepOutcome:
    """One step on one rank: op times (clock marks, aligned with the program) and the local loss."""

    marks: list = field(default_factory=list)  #: (start, end) mark per op
    loss: float = 0.0  #: sum of the micro-batch losses computed on this rank


class Executor:
    """Runs ``ctx.rank``'s program once per step. Mutable: the live activations of the step."""

    def __init__(self, ctx: RankContext):
        self.ctx = ctx
        self.program = ctx.schedule.programs[ctx.rank]
        self.split = {(a.stage, a.mb) for op in self.program for a in actions_of(op) if a.kind == "I"}
        split_stages = {s for s, _ in self.split}
        self.splitters = {s: Splitter(st, s) for s, st in ctx.stages.items() if s in split_stages}
        self.saved: dict[tuple[int, int], Saved] = {}
        self.scale = 1.0 / ctx.schedule.microbatches

    def step(self, inputs: list[torch.Tensor], targets: list[torch.Tensor]) -> StepOutcome:
        """Run the program on micro-batches ``inputs[mb]`` / ``targets[mb]``; gradients accumulate in .grad."""
        self.inputs, self.targets = inputs, targets
        out = StepOutcome()
        losses = []  # on the device; summed once at the end (no sync per micro-batch on a GPU)
        clock = self.ctx.clock
        for op in self.program:
            got = [self._receive(a) for a in actions_of(op)]
            start = clock.mark()
            for a, g in zip(actions_of(op), got):
                mb_loss = self._run(a, g)
                if mb_loss is not None:
                    losses.append(mb_loss)
            out.marks.append((start, clock.mark()))
        self.ctx.p2p.finish_step()
        if self.saved:
            raise RuntimeError(f"rank {self.ctx.rank}: (stage, mb) {next(iter(self.saved))} never finished its backward")
        out.loss = float(torch.stack(losses).sum()) if losses else 0.0
        return out

    def _receive(self, a: Action):
        """What ``a`` needs from another stage, before its clock starts."""
        kind, s, mb = a
        plan = self.ctx.plan
        if kind == "F" and s != plan.first[s]:
            return self.ctx.p2p.recv(Route(ACT, s, mb))
        if kind in ("B", "I") and s != plan.last[s]:
            return self.ctx.p2p.recv(Route(GRAD, s, mb))
        return None

    def _run(self, a: Action, got):
        kind, s, mb = a
        if kind == "F":
            return self._forward(s, mb, got)
        if kind == "W":
            weight_grad(self.saved.pop((s, mb)).rec)
            return None
        sv = self.saved[(s, mb)] if kind == "I" else self.saved.pop((s, mb))
        if kind == "B":
            torch.autograd.backward(sv.root, got)
            dx = sv.x.grad if sv.x.requires_grad else None
        else:
            dx = input_grad(sv.root, got, sv.x, sv.rec)
            sv.root = None  # the recorded holder outputs keep what W needs
        if s != self.ctx.plan.first[s]:
            self.ctx.p2p.send(Route(GRAD, s - 1, mb), dx)
        return None

    def _forward(self, s: int, mb: int, got):
        plan = self.ctx.plan
        if s == plan.first[s]:
            x = self.inputs[mb]
        else:
            x = got.requires_grad_(got.is_floating_point())
        splitter = self.splitters.get(s)
        if splitter is not None:
            with splitter.record((s, mb) in self.split) as rec:
                out = self.ctx.stages[s](x)
        else:
            rec, out = None, self.ctx.stages[s](x)
        loss = None
        if s == plan.last[s]:
            loss = self.ctx.loss(out, self.targets[mb]) * self.scale
            root = loss
        else:
            self.ctx.p2p.send(Route(ACT, s + 1, mb), out.detach())
            root = out
        self.saved[(s, mb)] = Saved(x=x, root=root, rec=rec)
        return None if loss is None else loss.detach().double()
