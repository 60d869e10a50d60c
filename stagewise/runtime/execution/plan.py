"""One rank's lowered program, grouped by compute op: what the runtime walks.

A schedule says only what each rank computes, in order (F, B, I, W, F&B). The core lowering
(``stagewise.lowering.lower``, under the run's ``Parallelism`` and the framework's ``Overlap``) adds the
communication each rank performs: receives before an op, sends after it, FSDP's UNSHARD before and RESHARD
after, REDUCE_GRAD after a stage's last backward (or after the drain, as the overlap says), the tie and the
step end after the last op. ``lower(schedule, rank, parallelism)`` groups that program by compute op: each
``Step`` holds its op, the routes its actions receive and send (the lowering's ``message_in`` and
``message_out``; stages on one rank hand over in memory), and the stages the lowered program gathers before
it, reduces and frees after it. The executor, the messages, data parallelism and FSDP read the steps and
never the programs again, so what the runtime issues is where the lowering (the simulator's, the
validator's and the pictures' program) put it. No torch here.

Example:
    >>> from stagewise.schedules import generate
    >>> from stagewise.parallelism import Parallelism
    >>> plan = lower(generate("1f1b", 2, 2), rank=1, parallelism=Parallelism(pp=2, dp=2))
    >>> [str(s.op) for s in plan.steps]
    ['1F0', '1B0', '1F1', '1B1']
    >>> plan.steps[0].recv, plan.steps[1].send
    ((Route(direction=0, stage=1, mb=0),), (Route(direction=1, stage=0, mb=0),))
    >>> [s.reduce for s in plan.steps], plan.tail
    ([(), (), (), (1,)], ('1STEP_END',))
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from ...actions import Action, actions_of
from ...lowering.comms import RECVS, REDUCE_GRAD, RESHARD, UNSHARD, CommAction
from ...lowering.lower import lower as lower_comms
from ...lowering.rules import stage_points
from ...lowering.options import FRAMEWORKS, LoweringOptions, Overlap
from ...parallelism import Parallelism
from ...schedule import Schedule
from ..messages.p2p import MessagePlan, Route, message_plan, route_in, route_out


class Step(NamedTuple):
    """One op of a rank's program with what it moves: per action of the op (an F&B pair has two), the route it
    receives before its clock starts and the route it sends after (None: nothing crosses a stage boundary)."""

    op: object  #: Action or Pair
    actions: tuple[Action, ...]  #: actions_of(op)
    recv: tuple[Route | None, ...]
    send: tuple[Route | None, ...]
    done: tuple[int, ...] = ()  #: stages whose weight gradients are complete after this op (their last B/W)
    gather: tuple[int, ...] = ()  #: stages the lowered program starts gathering before this op (FSDP's UNSHARD)
    free: tuple[int, ...] = ()  #: stages it releases after this op (FSDP's RESHARD after the stage's last op)
    reduce: tuple[int, ...] = ()  #: stages whose gradients it reduces after this op (REDUCE_GRAD: dp, fsdp, ep)
    comms: tuple = ()  #: the lowered program's communication actions around this op, in its order


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """A rank's lowered program. Immutable: derived once per (schedule, rank); the same on every replica."""

    rank: int  #: the rank of the schedule's programs (the pipeline rank)
    schedule: Schedule
    messages: MessagePlan  #: every cross-rank route of the schedule, in each sender's order
    steps: tuple[Step, ...]  #: one per op of the program, in order
    stages: tuple[int, ...]  #: the stages this rank holds, ascending
    split: frozenset  #: (stage, mb) whose backward is split (I then W) on this rank
    first_forward: dict  #: stage -> index of the step holding its first F in the step
    last_backward: dict  #: stage -> index of the step after which its weight gradients are complete
    tail: tuple = ()  #: the lowered program's collectives after the last op's own (ties, step end), as text

    @property
    def split_stages(self) -> frozenset[int]:
        """Stages that run an I somewhere (split backward: their holder outputs are recorded)."""
        return frozenset(s for s, _ in self.split)

    def is_first(self, stage: int) -> bool:
        """``stage`` starts its lane (takes the inputs)."""
        return stage == self.messages.first[stage]

    def is_last(self, stage: int) -> bool:
        """``stage`` ends its lane (computes the loss)."""
        return stage == self.messages.last[stage]


def lower(schedule: Schedule, rank: int, parallelism: Parallelism | None = None,
          overlap: Overlap | None = None) -> RankPlan:
    """``rank``'s program of ``schedule`` lowered under ``parallelism`` (default: the pipeline alone) and
    ``overlap`` (default: stagewise's own rule), grouped by compute op (see the module docstring)."""
    par = replace(parallelism or Parallelism(), pp=schedule.ranks)  # the schedule's ranks are the pipeline
    low = lower_comms(schedule, par, LoweringOptions(overlap=overlap or FRAMEWORKS["stagewise"]))
    messages = message_plan(schedule)
    program = schedule.programs[rank]
    first, last = messages.first, messages.last
    points = stage_points(program)
    split = {(a.stage, a.mb) for op in program for a in actions_of(op) if a.kind == "I"}
    done = _at(points.last_backward)
    around, tail = _around(low.programs[rank], len(program))
    gather = _at(_first_of(around, UNSHARD, "fsdp"))
    free = _at(_last_of(around, RESHARD))
    steps = []
    for k, op in enumerate(program):
        acts = tuple(actions_of(op))
        steps.append(Step(op=op, actions=acts, recv=tuple(route_in(a, first, last) for a in acts),
                          send=tuple(route_out(a, first, last) for a in acts), done=done.get(k, ()),
                          gather=gather.get(k, ()), free=free.get(k, ()),
                          reduce=tuple(c.stage for c in around[k] if c.kind == REDUCE_GRAD), comms=around[k]))
    return RankPlan(rank=rank, schedule=schedule, messages=messages, steps=tuple(steps),
                    stages=tuple(schedule.stages_of_rank(rank)), split=frozenset(split),
                    first_forward=points.first_forward, last_backward=points.last_backward,
                    tail=tuple(str(c) for c in tail))


def _around(lowered: tuple, ops: int) -> tuple[list[tuple], tuple]:
    """Per compute op, the communication actions the lowered program has around it: receives and gathers
    before it (up to the previous op's own), everything else after it; and what follows the last op's
    reductions and frees (ties, the step end, ZeRO-1's gathers after the optimizer step)."""
    around: list[list] = [[] for _ in range(ops)]
    k, pending = -1, []
    for a in lowered:
        if type(a) is not CommAction:
            k += 1
            around[k] += pending
            pending = []
        elif a.kind in RECVS or a.kind == UNSHARD or k < 0:
            pending.append(a)
        else:
            around[k].append(a)
    tail = tuple(pending) + tuple(a for a in (around[-1] if around else ()) if a.group in ("tie", "world"))
    if around:
        around[-1] = [a for a in around[-1] if a.group not in ("tie", "world")]
    return [tuple(x) for x in around], tail


def _first_of(around: list[tuple], kind: str, group: str) -> dict[int, int]:
    """stage -> the op before which its first ``kind`` over ``group`` comes."""
    out: dict[int, int] = {}
    for k, comms in enumerate(around):
        for c in comms:
            if c.kind == kind and c.group == group:
                out.setdefault(c.stage, k)
    return out


def _last_of(around: list[tuple], kind: str) -> dict[int, int]:
    """stage -> the op after which its last ``kind`` comes."""
    return {c.stage: k for k, comms in enumerate(around) for c in comms if c.kind == kind}


def _at(points: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """stage -> step index, as step index -> its stages (ascending)."""
    out: dict[int, list[int]] = {}
    for s, k in points.items():
        out.setdefault(k, []).append(s)
    return {k: tuple(sorted(v)) for k, v in out.items()}
