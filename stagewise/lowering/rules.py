"""The lowering's rules of what crosses ranks and where a rank's work on a stage begins and ends, each once.

``message_out``/``message_in``: what an action hands to another stage and what it needs from one (an F's
output, a B's or I's input gradient); ``send_orders``: each sender's messages to each receiver in its program
order (the order the receiver posts them: NCCL's FIFO per pair); ``stage_points``: each stage's first
forward, last backward, last use and where its gather is issued. ``lower`` places sends, receives, gathers,
reductions and frees by them; the runtime's routes (runtime/messages/p2p.py), its tensor-parallel sums
(runtime/execution/program.py) and the lowered programs' checks (check.py) read the same functions.

Example:
    >>> from stagewise.schedules import generate
    >>> sched = generate("1f1b", 2, 2)
    >>> send_orders(sched)[(0, 1)]
    [('F', 1, 0), ('F', 1, 1)]
    >>> stage_points(sched.programs[1]).last_backward
    {1: 3}
"""

from __future__ import annotations

from typing import NamedTuple

from ..actions import Action, Pair, actions_of
from ..schedule import Schedule


def send_orders(schedule: Schedule) -> dict[tuple[int, int], list[tuple]]:
    """(sender rank, receiver rank) -> the keys (``message_out``) of what it sends there, in the sender's
    program order: the order the receiver posts them in (NCCL's FIFO per pair)."""
    place, first, last = schedule.placement, schedule.first_stages, schedule.last_stages
    orders: dict[tuple[int, int], list[tuple]] = {}
    for r, prog in enumerate(schedule.programs):
        for op in prog:
            for a in actions_of(op):
                out = message_out(a, first, last)
                if out is not None and place[out[1]] != r:
                    orders.setdefault((r, place[out[1]]), []).append(out)
    return orders


def message_out(a: Action, first, last) -> tuple | None:
    """What ``a`` hands to another stage, as ("F", the stage it goes into, mb) (an F's output, past its lane's
    last stage) or ("B", ...) (a B's or I's input gradient, before its lane's first stage); None.
    ``first``/``last``: per stage, the first and last stage of its lane (``Schedule.first_stages``)."""
    kind, s, mb = a
    if kind == "F" and s != last[s]:
        return ("F", s + 1, mb)
    if kind in ("B", "I") and s != first[s]:
        return ("B", s - 1, mb)
    return None


def message_in(a: Action, first, last) -> tuple | None:
    """What ``a`` needs from another stage, as (its key, as ``message_out`` names it; the stage that sends it):
    an F an activation (past its lane's first stage), a B or I a gradient (before its lane's last stage,
    which starts the backward from its own loss); None."""
    kind, s, mb = a
    if kind == "F" and s != first[s]:
        return ("F", s, mb), s - 1
    if kind in ("B", "I") and s != last[s]:
        return ("B", s, mb), s + 1
    return None


class StagePoints(NamedTuple):
    """Where a rank's work on each of its stages begins and ends in its program (op positions): the rules the
    lowering places gathers, reductions and frees by."""

    first_forward: dict  #: stage -> its first F
    last_backward: dict  #: stage -> its last B or W (its weight gradients are complete after it)
    last_use: dict  #: stage -> its last op of any kind (a sharded stage is freed after it)
    gathers: dict  #: stage -> the op its gather is issued before: one stage ahead (see ``lower``)
    backwards: dict  #: stage -> every B or W of it, in order (each makes weight gradients)


def stage_points(program) -> StagePoints:
    """The ``StagePoints`` of one rank's program."""
    first_fw: dict[int, int] = {}
    last_bw: dict[int, int] = {}
    last_use: dict[int, int] = {}
    backwards: dict[int, list[int]] = {}
    for k, op in enumerate(program):
        for kind, s, _ in ((op.forward, op.backward) if type(op) is Pair else (op,)):
            last_use[s] = k
            if kind == "F":
                if s not in first_fw:
                    first_fw[s] = k
            elif kind == "B" or kind == "W":
                last_bw[s] = k
                backwards.setdefault(s, []).append(k)
    # one stage ahead: at the first forward of the stage whose first forward comes before its own (the
    # program's first stage: at its first op)
    order = sorted(first_fw, key=first_fw.get)
    gathers = {s: (first_fw[order[j - 1]] if j else 0) for j, s in enumerate(order)}
    return StagePoints(first_forward=first_fw, last_backward=last_bw, last_use=last_use, gathers=gathers,
                       backwards={s: tuple(ks) for s, ks in backwards.items()})
