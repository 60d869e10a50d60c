"""The overlapped F&B pair: one micro-batch's forward and another's backward interleaved at their all-to-alls.

An F&B pair (DualPipe's ``OVERLAP_F_B``) is two halves the executor may run one after the other. What
makes it worth pairing is communication that one half waits for while the other could compute: an MoE
block's dispatch and combine (parallel/ep.py). Every such communication is posted asynchronously and
waited through ``wait(work, name)``; inside an interleaved pair that is where the running half hands the
rank over to the other, which runs until its own next communication (or its end) and hands back; only
then is the first half's all-to-all waited for, its result being needed next. So each all-to-all runs
while the other micro-batch computes, and neither the order nor the waits are written per model or
family: they are where the model communicates. One half computes at a time (on a CPU the rank's cores
are the compute; the transfers run in the communication library's threads).

The generic ``interleave(pair)`` starts with the backward, whose first all-to-all (combine's gradient)
comes after the least compute, and runs it on a second thread, as torchtitan's DualPipeV overlap does; the
forward stays on the caller's. Halves meet only at communications, the same ones in the same order on
every rank of an ep group, so every rank posts its collectives in one order. A user's hook
(``Pipeline(overlap=fn)``: DualPipe's ``overlapped_forward_backward``, torch's ``OVERLAP_F_B`` custom
function) replaces it: ``fn(pair)`` gets an ``OverlapPair`` and must run each half once, in any order or
on any thread. The pair's sends are posted after both halves, in the program's order, as the simulator
has them (an F&B pair's outputs are ready at its end).

Example (a hook that runs the halves one after the other, backward first)::

    def backward_first(pair):
        pair.backward.run()
        pair.forward.run()

    pipe = stagewise.Pipeline("dualpipe", layers, loss_fn, microbatches=8, mesh=mesh, overlap=backward_first)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ..config import RunError


class Event(NamedTuple):
    """One thing a half did in an interleaved pair (the order tests read; the times the benchmark reads)."""

    half: str  #: "F" or "B"
    what: str  #: "start", "post" (an all-to-all posted, the rank handed over), "resume", "waited", "end"
    name: str  #: the communication ("dispatch", "combine"), "" for start and end
    time: float  #: time.perf_counter()


class Overlapped(NamedTuple):
    """What a step keeps of a pair run through a hook (``StepOutcome.overlaps``): no tensor, no closure."""

    op: object  #: the Pair
    events: list  #: its ``Event``s (empty unless the generic interleave ran it)


@dataclass(frozen=True, kw_only=True)
class Half:
    """One half of an F&B pair, as a hook sees it."""

    action: object  #: the Action (``3F2``, ``0B1``)
    stage: object  #: the stage's module (runtime.stages.stage.Stage)
    run: Callable[[], None]  #: run this half in full, as the executor would (once)


@dataclass(frozen=True, kw_only=True)
class OverlapPair:
    """An F&B pair handed to an overlap hook: its halves, and the events the generic interleave records."""

    op: object  #: the Pair
    forward: Half
    backward: Half
    events: list = field(default_factory=list)  #: ``Event``s, in order (the generic interleave fills it)


def interleave(pair: OverlapPair) -> None:
    """The generic overlap (see the module docstring): the backward on a second thread from the start, the
    forward on this one, handing the rank over at every ``wait``."""
    inter = Interleave(pair.events)
    errors: list[BaseException] = []
    stream = _current_stream(pair)

    def backward() -> None:
        if stream is not None:
            import torch

            torch.cuda.set_stream(stream)  # the forward's stream: the halves' kernels stay in program order
        _run_half(inter, "B", pair.backward.run, errors)

    global _current
    _current = inter
    worker = threading.Thread(target=backward, name="stagewise-pair-backward", daemon=True)
    try:
        worker.start()
        _run_half(inter, "F", pair.forward.run, errors)
        worker.join()
    finally:
        _current = None
    if errors:
        raise errors[0]


def wait(work, name: str) -> None:
    """Wait for a communication posted asynchronously (``work.wait()``); inside an interleaved pair, first hand
    the rank over to the other half until it communicates or ends."""
    inter = _current
    if inter is None:
        work.wait()
        return
    half = inter.handover(name)
    work.wait()
    inter.record(half, "waited", name)


def sequential(pair: OverlapPair) -> None:
    """No overlap: the forward, then the backward (what the executor does without a hook)."""
    pair.forward.run()
    pair.backward.run()


_current: "Interleave | None" = None  #: the pair being interleaved on this rank (a rank runs one op at a time)


class Interleave:
    """The baton two halves pass at their communications. Mutable: whose turn it is, which half ended."""

    def __init__(self, events: list, first: str = "B"):
        self.events = events
        self.cond = threading.Condition()
        self.turn = first
        self.ended: set[str] = set()
        self.forward_thread = threading.get_ident()

    def side(self) -> str:
        """The half the calling thread runs: the forward's thread is the caller's; anything else (the backward's
        thread, autograd's device threads, a recomputation inside the backward) is the backward."""
        return "F" if threading.get_ident() == self.forward_thread else "B"

    def record(self, half: str, what: str, name: str = "") -> None:
        self.events.append(Event(half, what, name, time.perf_counter()))

    def begin(self, half: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == half)
        self.record(half, "start")

    def handover(self, name: str) -> str:
        """The calling half posted ``name``: let the other half run until it hands back (or ends)."""
        half = self.side()
        other = _OTHER[half]
        self.record(half, "post", name)
        with self.cond:
            if other not in self.ended:
                self.turn = other
                self.cond.notify_all()
                self.cond.wait_for(lambda: self.turn == half)
        self.record(half, "resume", name)
        return half

    def end(self, half: str) -> None:
        self.record(half, "end")
        with self.cond:
            self.ended.add(half)
            self.turn = _OTHER[half]
            self.cond.notify_all()


_OTHER = {"F": "B", "B": "F"}


def _run_half(inter: Interleave, half: str, run: Callable, errors: list) -> None:
    try:
        inter.begin(half)
        run()
    except BaseException as e:  # noqa: BLE001 - re-raised by interleave on the caller's thread
        errors.append(e)
    finally:
        inter.end(half)


def _current_stream(pair: OverlapPair):
    """The caller's CUDA stream when the stages are on a GPU (a new thread starts on the default one)."""
    import torch

    p = next(iter(pair.forward.stage.parameters()), None)
    return torch.cuda.current_stream(p.device) if p is not None and p.device.type == "cuda" else None


def run_pair(executor, op, got: list, hook: Callable) -> list:
    """Run the F&B pair ``op`` through ``hook``: [(loss, what to send)] per action, in program order."""
    fa, ba = op
    executor.prepare_backward(ba)  # a recomputed stage replays its forward first, outside the interleaving
    done: dict[int, tuple] = {}

    def half(k: int, action, received) -> Callable[[], None]:
        def run() -> None:
            if k in done:
                raise RunError(f"`overlap` hook ran the pair's {action} twice; it runs each half once")
            done[k] = ()
            done[k] = executor._run(action, received)

        return run

    pair = OverlapPair(op=op, forward=Half(action=fa, stage=executor.ctx.stages[fa.stage], run=half(0, fa, got[0])),
                       backward=Half(action=ba, stage=executor.ctx.stages[ba.stage], run=half(1, ba, got[1])))
    hook(pair)
    for k, a in enumerate((fa, ba)):
        if not done.get(k):
            raise RunError(f"`overlap` hook returned without running the pair's {a} ({op}); a hook runs "
                           "pair.forward.run() and pair.backward.run() once each")
    executor.outcome.overlaps.append(Overlapped(pair.op, pair.events))
    return [done[0], done[1]]
