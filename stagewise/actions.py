"""Actions: the unit of work in a program, and their text form.

The text form is torch.distributed.pipelining's: ``{stage}{kind}{mb}`` (``2F0``,
``1B3``, ``0I5``, ``0W5``) and ``(0F7;7B3)OVERLAP_F_B`` for an overlapped pair.
Actions are named tuples because schedules hold hundreds of thousands of them (``collections.namedtuple``:
``typing.NamedTuple`` would import typing, a tenth of `stagewise simulate`'s start-up, and the schedule core
needs none of it).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Iterable
from itertools import repeat

from .errors import StagewiseError

F, B, I, W = "F", "B", "I", "W"
KINDS = (F, B, I, W)
#: kinds that produce the input gradient of their stage
GRAD_KINDS = (B, I)

#: memory actions (PipeOffload, Mario): move a (stage, micro-batch)'s saved activations to host memory over the
#: host link and back before its backward, or redo its forward where the program places it (its F then keeps
#: only its input); text ``0OFFLOAD3``, ``0RELOAD3``, ``0RECOMPUTE3`` as torch writes its named actions
OFFLOAD, RELOAD, RECOMPUTE = "OFFLOAD", "RELOAD", "RECOMPUTE"
MEMORY_KINDS = (OFFLOAD, RELOAD, RECOMPUTE)
#: the memory kinds that run on the rank's host-link stream (not on its compute)
HOST_KINDS = (OFFLOAD, RELOAD)

KIND_NAMES = {F: "forward", B: "backward", I: "input-grad backward", W: "weight-grad backward",
              OFFLOAD: "offload", RELOAD: "reload", RECOMPUTE: "recompute"}


class Action(namedtuple("Action", ("kind", "stage", "mb"))):
    """One action of micro-batch ``mb`` (int) on ``stage`` (int): ``kind`` is compute (F, B, I, W) or memory
    (``MEMORY_KINDS``)."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


#: ``new(Action, (kind, stage, mb))`` is ``Action(kind, stage, mb)`` without the named tuple's generated
#: ``__new__``: 2-3x faster, for the generators' hot loops (one cluster plan builds millions of actions)
new = tuple.__new__


def run(kind: str, stage: int, mbs: Iterable[int]) -> list[Action]:
    """``[Action(kind, stage, mb) for mb in mbs]``, made with ``new`` in C (``map``: a fifth faster than the
    comprehension; generators build most of their actions here).

    >>> run("F", 2, range(2))
    [Action(kind='F', stage=2, mb=0), Action(kind='F', stage=2, mb=1)]
    """
    return list(map(new, repeat(Action), zip(repeat(kind), repeat(stage), mbs)))


class Pair(namedtuple("Pair", ("forward", "backward"))):
    """An overlapped forward and backward run as one unit (DualPipe's F&B): two ``Action``."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})OVERLAP_F_B"

    @property
    def kind(self) -> str:
        return "F&B"


Op = Action | Pair

_ACTION_RE = re.compile(r"([0-9]+)(OFFLOAD|RELOAD|RECOMPUTE|[FBIW])([0-9]+)")  # ASCII digits: \d takes "１" (fullwidth) too
_PAIR_RE = re.compile(r"\(([0-9]+F[0-9]+);([0-9]+[BI][0-9]+)\)OVERLAP_F_B")


class ParseError(StagewiseError):
    """A cell of text that is not an action."""


def parse(text: str) -> Op:
    """Parse ``2F0`` or ``(0F7;7B3)OVERLAP_F_B``; the whole text must match."""
    text = text.strip()
    m = _ACTION_RE.fullmatch(text)
    if m:
        return Action(m[2], int(m[1]), int(m[3]))
    m = _PAIR_RE.fullmatch(text)
    if m:
        return Pair(parse(m[1]), parse(m[2]))  # type: ignore[arg-type]
    raise ParseError(
        f"not an action: {text!r} (expected STAGE KIND MB such as '2F0', kind one of "
        "F, B, I, W, OFFLOAD, RELOAD, RECOMPUTE, or '(0F7;7B3)OVERLAP_F_B')"
    )


def actions_of(op: Op) -> tuple[Action, ...]:
    """The plain actions inside an op (two for a pair)."""
    return (op.forward, op.backward) if type(op) is Pair else (op,)  # type: ignore[return-value]
