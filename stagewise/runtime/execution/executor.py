"""The executor: walk one rank's program, op by op, with real tensors.

Generic: it knows the four action kinds and the overlapped pair, never a
schedule family. What an op needs from other stages (an activation for F, a
gradient for B or I) is received before its clock starts, so a measured op
spans compute only and waiting shows up as idle time, as in the simulator.
A stage that recomputes (recompute.py) keeps only its input from F and
replays the forward at its B or I; the meter (activation_memory.py) counts
what each (stage, mb) holds; ``before`` hears of each op before its receives (fsdp.py gathers
there) and ``after`` as it ends (dp.py, fsdp.py reduce there).
Inputs, outputs and what crosses a boundary are pytrees (pytree.py): the
backward differentiates the output leaves that carry a gradient and sends back
one gradient per input leaf that carries one. A forward-only executor (a
program of F's, for evaluation) keeps nothing for a backward. An F&B pair runs
its forward, then its backward, unless the context has an ``overlap`` hook
(overlap.py: the halves interleaved at their all-to-alls); either way each
action's output is sent once it is computed, in the program's order.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...actions import Action
from ..stages import pytree
from .activation_memory import ActivationMeter
from .plan import RankPlan
from ..messages.p2p import P2P
from ..run.config import RunError
from ..resilience.flight import NO_FLIGHT
from .overlap import run_pair
from .recompute import Recompute
from .split_backward import Record, Splitter, input_grad, weight_grad
from ..stages.stage import Stage


@dataclass(kw_only=True)
class RankContext:
    """What one rank runs with. Mutable only through the objects it holds (stages, p2p)."""

    plan: RankPlan  #: the rank's lowered program (plan.py): its ops with their messages and stage points
    stages: dict[int, Stage]
    p2p: P2P
    loss: Callable  #: (output, target) -> mean loss of one micro-batch
    clock: object  #: timing.WallClock or timing.CudaClock
    recompute: Recompute | None = None  #: stages whose F keeps only the input (recompute.py)
    meter: ActivationMeter | None = None  #: counts activation bytes (activation_memory.py)
    after: Callable | None = None  #: called with each Step once it ran (data parallel starts reductions)
    before: Callable | None = None  #: called with each Step before its receives (sharded stages are gathered)
    flight: object = NO_FLIGHT  #: flight.Recorder: each op's start and end, kept for failure reports
    autocast: Callable | None = None  #: () -> context for forwards and the loss (mixed precision)
    forward_only: bool = False  #: evaluation: F's only, nothing kept for a backward, last-stage outputs kept
    overlap: Callable | None = None  #: runs each F&B pair (overlap.py); None: its forward, then its backward
    exchanging: frozenset = frozenset()  #: stages whose F, B and I all-to-all over ep inside them (ep.py)
    draws: Callable | None = None  #: mb -> the context a forward of it runs in (seeded dropout: stages/rng.py)


@dataclass(kw_only=True)
class Saved:
    """A (stage, mb) between its F and its backward. Mutable: I drops ``root``."""

    x: object  #: the stage input pytree (floating leaves collect their gradients, unless the lane's first stage)
    root: object  #: stage output pytree, or the loss on the lane's last stage
    rec: Record | None = None  #: split backward: holder outputs and, after I, their gradients
    rng: tuple | None = None  #: recomputation: the RNG state F started from (``root`` is None until the replay)
    held: tuple = ()  #: meter tokens of what the executor keeps: input, output; after I, W's gradients
    replayed: bool = False  #: recomputation: ``root`` comes from the replayed forward


@dataclass(kw_only=True)
class StepOutcome:
    """One step on one rank: op times (clock marks, aligned with the program) and the local loss."""

    marks: list = field(default_factory=list)  #: (start, end) mark per op
    loss: float = 0.0  #: sum of the micro-batch losses computed on this rank
    mb_losses: dict = field(default_factory=dict)  #: F action -> its loss tensor (names a non-finite one)
    outputs: dict = field(default_factory=dict)  #: forward-only: mb -> the last stage's output (detached)
    overlaps: list = field(default_factory=list)  #: overlap.Overlapped (the op, its events) of each pair run by a hook


class Executor:
    """Runs ``ctx.rank``'s program once per step. Mutable: the live activations of the step."""

    def __init__(self, ctx: RankContext):
        self.ctx = ctx
        self.plan = plan = ctx.plan
        self.rank = plan.rank
        self.splitters = {s: Splitter(st, s) for s, st in ctx.stages.items() if s in plan.split_stages}
        self.saved: dict[tuple[int, int], Saved] = {}
        self.scale = 1.0 / plan.schedule.microbatches

    def step(self, inputs: list | None, targets: list | None) -> StepOutcome:
        """Run the program on micro-batches ``inputs[mb]`` / ``targets[mb]``; gradients accumulate in .grad.

        ``inputs`` may be None on a rank without a lane's first stage, ``targets`` on one without a last
        stage (or in a forward-only step that computes no loss).
        """
        self.inputs, self.targets = inputs, targets
        out = self.outcome = StepOutcome()
        losses = []  # on the device; summed once at the end (no sync per micro-batch on a GPU)
        clock, meter, before, after = self.ctx.clock, self.ctx.meter, self.ctx.before, self.ctx.after
        if meter is not None:
            meter.start_step()
        p2p = self.ctx.p2p
        for step in self.plan.steps:
            self.ctx.flight.start(step.op)
            if before is not None:
                before(step)
            # what the op needs from other stages arrives before its clock starts: waiting is idle time
            got = [None if r is None else p2p.recv(r) for r in step.recv]
            start = clock.mark()
            if self.ctx.overlap is not None and len(step.actions) == 2:
                done = run_pair(self, step, got, self.ctx.overlap)
                for (_, value), out_route in zip(done, step.send):  # after both halves, in program order
                    self._send(out_route, value)
            else:
                done = []
                for a, g, out_route in zip(step.actions, got, step.send):
                    done.append(self._run(a, g))
                    self._send(out_route, done[-1][1])  # as soon as it is computed
            for a, (mb_loss, _) in zip(step.actions, done):
                if mb_loss is not None:
                    losses.append(mb_loss)
                    out.mb_losses[a] = mb_loss
            out.marks.append((start, clock.mark()))
            for a in step.actions:  # the all-to-alls ran inside the op; named after it, as the lowering has them
                if a.stage in self.ctx.exchanging and a.kind != "W":
                    self.ctx.flight.comm(f"{a.stage}ALL_TO_ALL{a.mb}")
            self.ctx.flight.end(step.op)
            if after is not None:
                after(step)
        self.ctx.p2p.finish_step()
        if meter is not None:
            meter.end_step()
        if self.saved:
            raise RuntimeError(f"rank {self.rank}: (stage, mb) {next(iter(self.saved))} never finished its backward")
        out.loss = float(torch.stack(losses).sum()) if losses else 0.0
        return out

    def _send(self, route, value) -> None:
        if route is not None:
            self.ctx.p2p.send(route, value)

    def _run(self, a: Action, got) -> tuple:
        """Run one action: (its micro-batch's loss or None, what it sends or None)."""
        kind, s, mb = a
        if kind == "F":
            return self._forward(s, mb, got)
        if kind == "W":
            weight_grad(self.saved.pop((s, mb)).rec)
            return None, None
        self.prepare_backward(a)
        sv = self.saved[(s, mb)] if kind == "I" else self.saved.pop((s, mb))
        first = self.plan.is_first(s)
        xs = [] if first else pytree.grad_leaves(sv.x)
        roots, grads = _roots(sv.root, got, self.plan.is_last(s), sv.replayed)
        with self._measure(kind, s):
            if kind == "B":
                if roots:
                    torch.autograd.backward(roots, grads)
                dx = tuple(_or_zeros(x.grad, x) for x in xs)
            else:
                dx = input_grad(roots, grads, xs, sv.rec)
                sv.root = None  # the recorded holder outputs keep what W needs
                sv.held = sv.held[:1]  # the input's token stays, the output's goes (before W's gradients count)
                sv.held += self._hold(*sv.rec.grads)
        return None, dx

    def prepare_backward(self, a: Action) -> None:
        """Before a B or I of a recomputed stage: replay its forward (once)."""
        sv = self.saved[(a.stage, a.mb)]
        if sv.rng is not None:
            self._replay(a.stage, a.mb, sv)

    def _forward(self, s: int, mb: int, got):
        plan = self.plan
        x = self._input(s, mb) if plan.is_first(s) else got
        recompute = self.ctx.recompute is not None and s in self.ctx.recompute
        with self._measure("F", s):
            if self.ctx.forward_only:
                with torch.no_grad():
                    out, root, _ = self._compute(s, mb, x)
            elif recompute:  # keep only the input and the RNG state; the backward replays the forward
                rng = self.ctx.recompute.rng_state()
                with torch.no_grad():
                    out, root, _ = self._compute(s, mb, x)
                self.saved[(s, mb)] = Saved(x=pytree.detached(x), root=None, rng=rng, held=self._hold(x))
            else:
                out, root, rec = self._compute(s, mb, x)
                self.saved[(s, mb)] = Saved(x=x, root=root, rec=rec, held=self._hold(x, root))
        if plan.is_last(s):
            if self.ctx.forward_only:
                self.outcome.outputs[mb] = pytree.map_tensors(torch.Tensor.detach, out)
            return None if root is None else root.detach().double(), None
        if recompute:  # computed without autograd: every floating leaf may need a gradient (see _roots)
            out = pytree.map_tensors(lambda t: t.detach().requires_grad_(t.is_floating_point()), out)
        return None, out

    def _input(self, s: int, mb: int):
        if self.inputs is None:
            raise RunError(f"rank {self.rank} holds stage {s}, the first stage of a model copy, so it needs the "
                           "inputs: pass them to step() on this rank (every rank may pass the same batch)")
        return self.inputs[mb]

    def _target(self, s: int, mb: int):
        if self.targets is None:
            raise RunError(f"rank {self.rank} holds stage {s}, the last stage of a model copy, which computes "
                           "the loss, so it needs the targets: pass them to step() on this rank (every rank may "
                           "pass the same batch)")
        return self.targets[mb]

    def _compute(self, s: int, mb: int, x):
        """The stage's forward: (output, what the backward differentiates: the output or the loss, Record)."""
        splitter = self.splitters.get(s)
        record = splitter.record((s, mb) in self.plan.split) if splitter is not None else nullcontext()
        last = self.plan.is_last(s)
        autocast = self.ctx.autocast() if self.ctx.autocast is not None else nullcontext()
        draws = self.ctx.draws(mb) if self.ctx.draws is not None else nullcontext()
        with self._saving(), record as rec, autocast, draws:
            out = self.ctx.stages[s](x)
            if not last:
                root = out
            elif self.ctx.forward_only and self.targets is None:
                root = None  # inference: outputs only
            else:
                root = self.ctx.loss(out, self._target(s, mb)) * self.scale
        return out, root, rec

    def _replay(self, s: int, mb: int, sv: Saved) -> None:
        """Recomputation: run the forward again from the kept input and RNG state, with autograd on."""
        x = sv.x if self.plan.is_first(s) else pytree.detached(sv.x)
        with self._measure("R", s), self.ctx.recompute.replaying(sv.rng):
            _, sv.root, sv.rec = self._compute(s, mb, x)
            sv.x, sv.rng, sv.held, sv.replayed = x, None, self._hold(x, sv.root), True

    def _measure(self, kind: str, s: int):
        return self.ctx.meter.op(kind, s) if self.ctx.meter is not None else nullcontext()

    def _saving(self):
        return self.ctx.meter.saving() if self.ctx.meter is not None else nullcontext()

    def _hold(self, *trees) -> tuple:
        if self.ctx.meter is None:
            return ()
        return self.ctx.meter.hold(*(t for tree in trees for t in pytree.tensors(tree)))


def _roots(root, got, last: bool, replayed: bool = False) -> tuple[list, list | None]:
    """What a backward differentiates and the gradients it starts from: the loss alone on a last stage,
    otherwise the output leaves that carry a gradient, with the gradients received for them. A recomputing
    stage sent every floating leaf as needing one (its forward ran without autograd), so its gradients pair
    with the floating leaves, of which the replay tells those that need one."""
    if last:
        return [root], None
    if not replayed:
        return pytree.grad_leaves(root), list(got)
    floating = [t for t in pytree.tensors(root) if t.is_floating_point() or t.is_complex()]
    pairs = [(t, g) for t, g in zip(floating, got) if t.requires_grad]
    return [t for t, _ in pairs], [g for _, g in pairs]


def _or_zeros(grad, x: torch.Tensor) -> torch.Tensor:
    """A leaf the stage did not use gets a zero gradient, so every message of a route has one structure."""
    return grad if grad is not None else torch.zeros_like(x)
