"""The executor: walk one rank's lowered program, action by action, with real tensors.

Generic, as torch's ``_PipelineScheduleRuntime``: one handler per kind of action (the compute ops F, B, I, W
and the F&B pair; SEND, RECV, UNSHARD, RESHARD, REDUCE_GRAD, ALL_TO_ALL; TIE_GRAD and STEP_END, the step's
end), never a schedule family, and nothing regrouped: what runs is the program the lowering wrote
(plan.py), in its order. A message's header (SEND_F_HDR ...) goes with its data: the data's SEND or RECV
sends or takes it first, on the same channel (p2p.py reads which messages carry one from the program). A
RECV posts its receive (p2p.py); the op that needs the message waits for it
before its clock starts, so a measured op spans compute only and waiting shows up as idle time, as in the
simulator. An op's outputs wait in the rank's mailbox for their SEND, or for the op of a stage on this rank
that takes them (handed over in memory). FSDP (parallel/fsdp.py) gathers at UNSHARD, waits for a stage's
gathers before its op's clock starts, reduces and frees at REDUCE_GRAD and RESHARD; data parallel (dp.py,
ep.py) reduces at REDUCE_GRAD; tensor parallel sums a stage's partial gradients once its last backward ran.
The step's end (the first TIE_GRAD or STEP_END, or the program's end) waits for the sends and hands over to
the context's ``end`` (the reductions waited for, the copies summed); where the context has a ``tie`` hook, each
TIE_GRAD then all-reduces its rank set's copies (parallel/replicas.py), else ``end`` summed them all.

A stage that recomputes (recompute.py) keeps only its input from F and replays the forward at its B or I.
The memory actions have a handler each: OFFLOAD moves a (stage, mb)'s saved activations to host memory and
RELOAD brings them back (offload.py; its backward waits for them), and a (stage, mb) with a RECOMPUTE keeps
only its input from F and replays its forward where the program places the RECOMPUTE, so its backward
replays nothing; like compute ops they are marked on the rank's clock. The meter (activation_memory.py)
counts what each (stage, mb) holds on the device. Inputs, outputs and what crosses a boundary are pytrees
(pytree.py): the backward differentiates the output leaves that carry a gradient and sends back one gradient
per input leaf that carries one. A forward-only executor (a program of F's, for evaluation) keeps nothing
for a backward. An F&B pair runs its forward, then its backward, unless the context has an ``overlap`` hook
(fb_pair.py: the halves interleaved at their all-to-alls); either way its outputs are sent after it, by the
SENDs that follow it.

With sequence slices (``Schedule.slices`` k; ``stages/kv.py``) an action's ``mb`` is a unit, slice ``u % k`` of
micro-batch ``u // k``: its forward runs with the keys and values its micro-batch's earlier slices left on the
stage (a ``kv.Carry`` per (stage, micro-batch)), its backward (B or I) also differentiates the stand-in leaves of
those keys and values and hands their gradients back, and adds the gradients later slices handed back for its
own as extra (tensor, gradient) pairs. Each unit's loss weighs its share of the step's tokens (the pipeline's
``scales``).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import torch

from ...actions import MEMORY_KINDS, OFFLOAD, RECOMPUTE, RELOAD, Action, Pair
from ...comm_actions import (ALL_TO_ALL, HEADERS, RECV_B, RECV_F, REDUCE_GRAD, RESHARD, SEND_B, SEND_F, STEP_END,
                               TIE_GRAD, UNSHARD, CommAction)
from ...slices import split_unit
from ..stages import kv, pytree
from .activation_memory import ActivationMeter
from .program import RankPlan
from ..messages.p2p import P2P, route_in, route_of, route_out
from ..config import RunError
from ..resilience.flight import NO_FLIGHT
from .fb_pair import run_pair
from .offload import Offload
from .recompute import Recompute
from .split_backward import Record, Splitter, input_grad, weight_grad
from ..stages.stage import Stage


@dataclass(kw_only=True)
class RankContext:
    """What one rank runs with. Mutable only through the objects it holds (stages, p2p)."""

    plan: RankPlan  #: the rank's lowered program (program.py)
    stages: dict[int, Stage]
    p2p: P2P
    loss: Callable  #: (output, target) -> mean loss of one micro-batch
    clock: object  #: timing.WallClock or timing.CudaClock
    recompute: Recompute | None = None  #: stages whose F keeps only the input (recompute.py)
    meter: ActivationMeter | None = None  #: counts activation bytes (activation_memory.py)
    sharded: object = None  #: fsdp.Sharded: gathers at UNSHARD, frees at RESHARD, an op waits for its gathers
    reducers: tuple = ()  #: what reduces a stage at REDUCE_GRAD, in order (fsdp.Sharded, dp.DataParallel)
    complete: Callable | None = None  #: called with each stage once its weight gradients are complete (tp sums)
    end: Callable | None = None  #: the step's end, after the sends: the reductions waited for, the copies summed
    tie: Callable | None = None  #: runs a TIE_GRAD (after the end): its set's copies summed; None: the end sums them
    flight: object = NO_FLIGHT  #: flight.Recorder: each op's start and end, kept for failure reports
    autocast: Callable | None = None  #: () -> context for forwards and the loss (mixed precision)
    forward_only: bool = False  #: evaluation: F's only, nothing kept for a backward, last-stage outputs kept
    overlap: Callable | None = None  #: runs each F&B pair (fb_pair.py); None: its forward, then its backward
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

    marks: list = field(default_factory=list)  #: (start, end) mark per compute op
    loss: float = 0.0  #: sum of the micro-batch losses computed on this rank
    mb_losses: dict = field(default_factory=dict)  #: F action -> its loss tensor (names a non-finite one)
    outputs: dict = field(default_factory=dict)  #: forward-only: mb -> the last stage's output (detached)
    overlaps: list = field(default_factory=list)  #: overlap.Overlapped (the op, its events) of each pair run by a hook
    executed: list = field(default_factory=list)  #: every action of the lowered program, as its handler ran it


class Executor:
    """Runs ``ctx.rank``'s program once per step. Mutable: the live activations of the step."""

    def __init__(self, ctx: RankContext):
        self.ctx = ctx
        self.plan = plan = ctx.plan
        self.rank = plan.rank
        self.splitters = {s: Splitter(st, s) for s, st in ctx.stages.items() if s in plan.split_stages}
        self.saved: dict[tuple[int, int], Saved] = {}
        self.slices = plan.schedule.slices  #: sequence slices per micro-batch: actions' ``mb`` are units (kv.py)
        self.carries: dict[tuple[int, int], kv.Carry] = {}  # (stage, micro-batch) -> its slices' keys and values
        self.scales = [1.0 / plan.schedule.microbatches] * plan.schedule.microbatches  # set per step from targets
        self.completes: dict[int, list[int]] = {}  # compute op index -> stages complete after it
        for s, k in sorted(plan.last_backward.items()):
            self.completes.setdefault(k, []).append(s)
        self.offload = Offload(_device(ctx.stages), ctx.stages, ctx.meter) if plan.offloaded else None
        self.handlers = {SEND_F: self._send, SEND_B: self._send, RECV_F: self._recv, RECV_B: self._recv,
                         UNSHARD: self._unshard, RESHARD: self._reshard, REDUCE_GRAD: self._reduce_grad,
                         ALL_TO_ALL: self._all_to_all, TIE_GRAD: self._tie_grad, STEP_END: self._step_end,
                         OFFLOAD: self._offload, RELOAD: self._reload, RECOMPUTE: self._recompute}
        self.handlers.update({kind: self._header for kind in HEADERS})

    def use(self, plan: RankPlan) -> None:
        """Walk ``plan`` from the next step on: the same compute program lowered with other headers (the
        pipeline picks one per step); the messages follow it."""
        self.plan = self.ctx.plan = plan
        self.ctx.p2p.plan = plan.messages

    def step(self, inputs: list | None, targets: list | None, scales: list | None = None) -> StepOutcome:
        """Run the program on micro-batches ``inputs[mb]`` / ``targets[mb]``; gradients accumulate in .grad.

        ``inputs`` may be None on a rank without a lane's first stage, ``targets`` on one without a last
        stage (or in a forward-only step that computes no loss). ``scales``: what each micro-batch's loss
        counts in the step's (default: 1/m each).
        """
        self.inputs, self.targets = inputs, targets
        m = self.plan.schedule.microbatches
        self.scales = list(scales) if scales is not None else [1.0 / m] * m
        out = self.outcome = StepOutcome()
        self.losses: list = []  # on the device; summed once at the end (no sync per micro-batch on a GPU)
        self.mail: dict = {}  # route -> (True, the RECV) once a RECV posted it, (False, the pytree) an op made
        self.ops, self.ended = 0, False
        self.carries.clear()
        if self.ctx.meter is not None:
            self.ctx.meter.start_step()
        handlers = self.handlers
        for a in self.plan.program:
            if type(a) is CommAction:
                handlers[a.kind](a)
            elif a.kind in MEMORY_KINDS:
                self._memory(a, handlers[a.kind])
            else:
                self._op(a)
            out.executed.append(a)
        if not self.ended:
            self._step_end(None)
        return out

    # ---- one handler per kind

    def _op(self, op) -> None:
        """F, B, I, W or an F&B pair: its inputs taken before its clock starts (waiting for a message is idle
        time), its outputs left in the mailbox for the SENDs after it."""
        ctx, plan = self.ctx, self.plan
        acts = (op.forward, op.backward) if type(op) is Pair else (op,)
        ctx.flight.start(op)
        first, last = plan.schedule.first_stages, plan.schedule.last_stages
        got = [self._take(a, route_in(a, first, last)) for a in acts]
        if ctx.sharded is not None:
            for a in acts:
                ctx.sharded.ready(a)
        start = ctx.clock.mark()
        if ctx.overlap is not None and len(acts) == 2:
            done = run_pair(self, op, got, ctx.overlap)
        else:
            done = [self._run(a, g) for a, g in zip(acts, got)]
        for a, (mb_loss, value) in zip(acts, done):
            if mb_loss is not None:
                self.losses.append(mb_loss)
                self.outcome.mb_losses[a] = mb_loss
            route = route_out(a, first, last)
            if route is not None:
                self.mail[route] = (False, value)
        self.outcome.marks.append((start, ctx.clock.mark()))
        ctx.flight.end(op)
        for s in self.completes.get(self.ops, ()) if ctx.complete is not None else ():
            ctx.complete(s)
        self.ops += 1

    def _take(self, a: Action, route):
        """What ``a`` needs from another stage: received by a RECV, or handed over from an op on this rank."""
        if route is None:
            return None
        got = self.mail.pop(route, None)
        if got is None:
            raise RuntimeError(f"rank {self.rank}: {a} needs {route.describe()}, which no RECV or op before it "
                               "brought; the programs disagree")
        posted, value = got
        if not posted:
            return self.ctx.p2p.hand_over(route, value)
        t0 = time.perf_counter()
        tree = self.ctx.p2p.recv(route, value.peer)
        self.ctx.flight.done(str(value), time.perf_counter() - t0)  # the RECV: issued at its post, done here
        return tree

    def _send(self, c: CommAction) -> None:
        route = route_of(c)
        self.ctx.flight.issued(str(c))
        self.ctx.p2p.send(route, self.mail.pop(route)[1], c.peer, str(c))

    def _recv(self, c: CommAction) -> None:
        """Posted here, waited for by the op that takes it (as torch's runtime does)."""
        route = route_of(c)
        self.ctx.flight.issued(str(c))
        self.ctx.p2p.post(route, c.peer)
        self.mail[route] = (True, c)

    def _header(self, c: CommAction) -> None:
        """A header: sent or taken by its data's SEND or RECV, which follows it on the same channel."""

    def _unshard(self, c: CommAction) -> None:
        if self.ctx.sharded is not None and c.group == "fsdp":  # ZeRO-1's over dp is the optimizer's broadcast
            self.ctx.sharded.unshard(c.stage)

    def _reshard(self, c: CommAction) -> None:
        if self.ctx.sharded is not None:
            self.ctx.sharded.reshard(c.stage, training=not self.ctx.forward_only)

    def _reduce_grad(self, c: CommAction) -> None:
        for reducer in self.ctx.reducers:
            reducer.reduce(c.stage)

    def _all_to_all(self, c: CommAction) -> None:
        self.ctx.flight.comm(str(c))  # it ran inside the op before it (parallel/ep.py); named as lowered

    def _memory(self, a: Action, run: Callable) -> None:
        """A memory action: an op of the rank's program, marked on its clock like compute (what it issues on
        CUDA's side stream runs past its mark)."""
        self.ctx.flight.start(a)
        start = self.ctx.clock.mark()
        run(a)
        self.outcome.marks.append((start, self.ctx.clock.mark()))
        self.ctx.flight.end(a)
        self.ops += 1

    def _offload(self, a: Action) -> None:
        """OFFLOAD: the (stage, mb)'s saved activations to host memory (offload.py); its input and output stay."""
        sv = self.saved.get((a.stage, a.mb))
        keep = () if sv is None else [t for tree in (sv.x, sv.root) for t in pytree.tensors(tree)]
        with self._measure(OFFLOAD, a.stage):  # what it took off the device (the prediction's moved bytes)
            self.offload.offload((a.stage, a.mb), keep)

    def _reload(self, a: Action) -> None:
        self.offload.reload((a.stage, a.mb))

    def _recompute(self, a: Action) -> None:
        """RECOMPUTE: the (stage, mb)'s forward again, with autograd, here; its backward then replays nothing."""
        sv = self.saved.get((a.stage, a.mb))
        if sv is None or sv.rng is None:
            raise RunError(f"rank {self.rank}: {a} has no forward {a.stage}F{a.mb} before it that kept only its "
                           "input (or it ran twice)")
        self._replay(a.stage, a.mb, sv)

    def _tie_grad(self, c: CommAction) -> None:
        """The step's end (once), then this tie's all-reduce where the context runs ties as actions."""
        self._step_end(c)
        if self.ctx.tie is not None:
            self.ctx.tie(c)

    def _step_end(self, c: CommAction | None) -> None:
        """TIE_GRAD, STEP_END or the program's end: the step's end, once (the copies are summed together, and
        the loss's all-reduce is the pipeline's, which reads the loss)."""
        if self.ended:
            return
        self.ended = True
        self.ctx.p2p.finish_step()
        if self.ctx.meter is not None:
            self.ctx.meter.end_step()
        if self.saved:
            raise RuntimeError(f"rank {self.rank}: (stage, mb) {next(iter(self.saved))} never finished its backward")
        if self.mail:
            raise RuntimeError(f"rank {self.rank}: {next(iter(self.mail)).describe()} was never used; the programs "
                               "disagree")
        self.outcome.loss = float(torch.stack(self.losses).sum()) if self.losses else 0.0
        if self.ctx.end is not None:
            self.ctx.end()

    # ---- the compute

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
        carry, j = self._carry(s, mb)
        leaves = carry.leaves_of(j) if carry is not None else []
        if carry is not None:  # the gradients later slices handed back join this slice's backward
            roots, grads = _with_extra(roots, grads, *carry.extra(j))
        with self._measure(kind, s):
            if kind == "B":
                if roots:
                    torch.autograd.backward(roots, grads)
                dx = tuple(_or_zeros(x.grad, x) for x in xs)
                handed = [leaf.grad for leaf in leaves]
            else:
                got_all = input_grad(roots, grads, xs + leaves, sv.rec)
                dx, handed = got_all[:len(xs)], got_all[len(xs):]
                sv.root = None  # the recorded holder outputs keep what W needs
                sv.held = sv.held[:1]  # the input's token stays, the output's goes (before W's gradients count)
                sv.held += self._hold(*sv.rec.grads)
            if carry is not None:
                carry.hand_back(j, handed)
                if carry.done(j):
                    del self.carries[(s, mb // self.slices)]
        return None, dx

    def _carry(self, s: int, u: int) -> tuple[kv.Carry | None, int]:
        """(the carry of unit ``u``'s micro-batch on stage ``s``, its slice), or (None, 0) without slices."""
        if self.slices == 1:
            return None, 0
        m, j = split_unit(u, self.slices)
        return self.carries.setdefault((s, m), kv.Carry()), j

    def prepare_backward(self, a: Action) -> None:
        """Before a B or I: an offloaded (stage, mb)'s activations reloaded; a recomputed one's forward replayed
        (once, unless its RECOMPUTE did)."""
        if self.offload is not None and (a.stage, a.mb) in self.offload:
            self.offload.ready(a)
        sv = self.saved[(a.stage, a.mb)]
        if sv.rng is not None:
            self._replay(a.stage, a.mb, sv)

    def _forward(self, s: int, mb: int, got):
        plan = self.plan
        x = self._input(s, mb) if plan.is_first(s) else got
        recompute = self.ctx.recompute is not None and (s in self.ctx.recompute or (s, mb) in plan.recomputed)
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
        if self.ctx.forward_only and self.slices > 1 and mb % self.slices == self.slices - 1:
            self.carries.pop((s, mb // self.slices), None)  # the micro-batch's last slice: nothing attends later
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
        carry, j = self._carry(s, mb)
        sliced = kv.running(carry, j, kv.slice_length(x), grad=not self.ctx.forward_only) if carry is not None \
            else nullcontext()
        with self._saving(s, mb), record as rec, autocast, draws, sliced:
            out = self.ctx.stages[s](x)
            if not last:
                root = out
            elif self.ctx.forward_only and self.targets is None:
                root = None  # inference: outputs only
            else:
                root = self.ctx.loss(out, self._target(s, mb)) * self.scales[mb]
        return out, root, rec

    def _replay(self, s: int, mb: int, sv: Saved) -> None:
        """Recomputation: run the forward again from the kept input and RNG state, with autograd on."""
        x = sv.x if self.plan.is_first(s) else pytree.detached(sv.x)
        with self._measure("R", s), self.ctx.recompute.replaying(sv.rng):
            _, sv.root, sv.rec = self._compute(s, mb, x)
            sv.x, sv.rng, sv.held, sv.replayed = x, None, self._hold(x, sv.root), True

    def _measure(self, kind: str, s: int):
        return self.ctx.meter.op(kind, s) if self.ctx.meter is not None else nullcontext()

    def _saving(self, s: int, mb: int):
        if self.offload is not None and (s, mb) in self.plan.offloaded and not self.ctx.forward_only:
            return self.offload.saving((s, mb))  # counted by the meter too
        return self.ctx.meter.saving() if self.ctx.meter is not None else nullcontext()

    def _hold(self, *trees) -> tuple:
        if self.ctx.meter is None:
            return ()
        return self.ctx.meter.hold(*(t for tree in trees for t in pytree.tensors(tree)))


def _device(stages: dict) -> torch.device:
    """Where the stages' parameters live (the CPU for stages without any)."""
    return next((p.device for st in stages.values() for p in st.parameters()), torch.device("cpu"))


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



def _with_extra(roots: list, grads: list | None, tensors: list, extra: list) -> tuple[list, list | None]:
    """A slice's backward roots with its carried tensors and the gradients later slices handed back for them."""
    if not tensors:
        return roots, grads
    if grads is None:  # the loss alone: its gradient is one
        grads = [torch.ones_like(r) for r in roots]
    return [*roots, *tensors], [*grads, *extra]


def _or_zeros(grad, x: torch.Tensor) -> torch.Tensor:
    """A leaf the stage did not use gets a zero gradient, so every message of a route has one structure."""
    return grad if grad is not None else torch.zeros_like(x)
