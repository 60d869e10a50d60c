"""Injected faults, for tests only: make one rank exit, raise, stall or produce a NaN loss at a chosen op.

Given as ``RunConfig.fault`` or, for whole command lines (``stagewise train``,
torchrun), the ``STAGEWISE_FAULT`` environment variable. Deliberately not a
command-line option. The text is ``HOW:rank=R:action=OP[:step=K]``:

- ``exit``: the rank dies at once (``os._exit(3)``: no message, no clean-up), as in a crash;
- ``raise``: the rank raises ``InjectedFault``;
- ``hang``: the rank stops making progress (sleeps an hour); its peers time out after ``--timeout``;
- ``nan``: the loss of the op's micro-batch becomes NaN (OP must be the F of a lane's last stage);
- ``lose``: the rank dies as with ``exit`` (``os._exit(4)``) and its slot is gone for good: a restarted local
  run (``--max-restarts``) gets one rank fewer, so an ``--elastic`` run shrinks (restart.py); with
  ``:back=J`` the slot returns once step J has run, and the run grows back at its next checkpoint;
- ``term``: a preemption notice: the rank sends itself SIGTERM (``--save-on-signal``: preempt.py).

A fault fires once per run, not again in a restarted attempt: the local restart loop drops it, and under
torchrun a restarted worker (``TORCHELASTIC_RESTART_COUNT`` > 0) has none.

The fault fires when rank R starts the op containing action OP (``1F3``) in
step K (1-based, as printed: ``step 2/4``; default 1), before the op's receives.
No torch here: ``RunConfig.check`` parses the text before any rank starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ...actions import Action, ParseError, actions_of, parse
from ..config import RunError

HOWS = ("exit", "raise", "hang", "nan", "lose", "term")
EXIT_CODE = 3
LOST_CODE = 4  #: the exit status of a ``lose`` fault: the launcher takes that rank's slot away
ENV = "STAGEWISE_FAULT"
_FORM = ("HOW:rank=R:action=OP[:step=K][:back=J], HOW one of " + ", ".join(HOWS) +
         " (e.g. exit:rank=1:action=1F3:step=2; back=J only with lose)")


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault throws."""


@dataclass(frozen=True, kw_only=True)
class Fault:
    """One injected fault: ``how`` on rank ``rank`` when it starts ``action`` in step ``step`` (1-based)."""

    how: str
    rank: int
    action: Action
    step: int = 1
    back: int | None = None  #: ``lose`` only: the slot returns once this step (1-based) has run


def parse_fault(text: str) -> Fault:
    """``exit:rank=1:action=1F3:step=2`` -> Fault; ``RunError`` naming the rule otherwise."""
    how, *fields = text.split(":")
    if how not in HOWS:
        raise RunError(f"fault {text!r}: {how!r} is not one of {', '.join(HOWS)}; expected {_FORM}")
    kv = {}
    for f in fields:
        key, sep, value = f.partition("=")
        if not sep or key not in ("rank", "action", "step", "back") or key in kv:
            raise RunError(f"fault {text!r}: bad field {f!r}; expected {_FORM}")
        kv[key] = value
    if "rank" not in kv or "action" not in kv:
        raise RunError(f"fault {text!r}: needs rank= and action=; expected {_FORM}")
    try:
        action = parse(kv["action"])
        rank, step = int(kv["rank"]), int(kv.get("step", 1))
        back = int(kv["back"]) if "back" in kv else None
    except (ParseError, ValueError) as e:
        raise RunError(f"fault {text!r}: {e}") from None
    if type(action) is not Action or rank < 0 or step < 1:
        raise RunError(f"fault {text!r}: needs one action like 1F3, rank >= 0 and step >= 1")
    if back is not None and (how != "lose" or back < step):
        raise RunError(f"fault {text!r}: back=J (the step after which a lost slot returns) needs HOW lose and "
                       f"J >= step ({step})")
    return Fault(how=how, rank=rank, action=action, step=step, back=back)


def check_fault(fault: Fault, schedule, replicas: int = 1) -> None:
    """The fault's action must be in its rank's program (a NaN needs the F of a lane's last stage).

    ``rank`` is global: with ``replicas`` data-parallel pipelines, rank r runs pipeline rank r % p's program.
    """
    a = fault.action
    where = f"fault {fault.how}:rank={fault.rank}:action={a}"
    p = schedule.ranks
    if fault.rank >= p * replicas or all(a not in actions_of(op) for op in schedule.programs[fault.rank % p]):
        raise RunError(f"{where}: rank {fault.rank} of {schedule.name} (p={p}, {p * replicas} ranks) does not "
                       f"run {a}")
    if fault.how == "nan" and (a.kind != "F" or schedule.last_stages[a.stage] != a.stage):
        raise RunError(f"{where}: a nan fault poisons the loss, so it needs the F of a lane's last stage")


class Injector:
    """Fires ``fault`` on its rank. Mutable: whether the op running now must produce a NaN loss."""

    def __init__(self, fault: Fault):
        self.fault = fault
        self.poison = False

    def at(self, step: int, op) -> None:
        """Called when an op starts (``flight.Recorder.on_start``)."""
        f = self.fault
        self.poison = False
        if step != f.step or f.action not in actions_of(op):
            return
        if f.how in ("exit", "lose"):
            os._exit(EXIT_CODE if f.how == "exit" else LOST_CODE)
        if f.how == "term":
            import signal

            os.kill(os.getpid(), signal.SIGTERM)  # handled by preempt.StopNotice at the next bytecode
            return
        if f.how == "raise":
            raise InjectedFault(f"injected on purpose at {f.action} (step {step})")
        if f.how == "hang":
            time.sleep(3600)
        self.poison = True

    def loss(self, fn):
        """``fn`` (output, target) -> loss, NaN while the poisoned op runs."""

        def loss(output, target):
            value = fn(output, target)
            return value * float("nan") if self.poison else value

        return loss


def injector_for(text: str | None, rank: int) -> Injector | None:
    """The injector of ``rank`` for the fault ``text`` (None when it targets another rank or there is none)."""
    if not text or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:  # once per run
        return None
    fault = parse_fault(text)
    return Injector(fault) if fault.rank == rank else None
