"""One rank's program lowered once: every fact the runtime needs from the schedule, derived in one place.

A schedule says only what each rank computes, in order (F, B, I, W, F&B). Running it also needs, per op,
what it receives before its clock starts and what it sends after, and per stage, where its work in the
step begins and ends: the first forward (where a sharded stage must be gathered: FSDP's unshard) and the
last action that adds weight gradients (where its gradients are complete: data parallel's reduction,
FSDP's reduce-scatter). ``lower(schedule, rank)`` derives all of it from the programs, the stage points by
the core lowering's own rules (``lowering.lower.stage_points``, where the simulator's UNSHARD, REDUCE_GRAD and
RESHARD come from, so the two cannot drift apart), like torch's
passes that turn a compute-only schedule into one with sends, receives, unshard/reshard and reduce-grad
actions; the executor, the messages, data parallelism and the parallel wrappers read the result and
never the programs again. No torch here.

Example:
    >>> from stagewise.schedules import generate
    >>> plan = lower(generate("1f1b", 2, 2), rank=1)
    >>> [str(s.op) for s in plan.steps]
    ['1F0', '1B0', '1F1', '1B1']
    >>> plan.steps[0].recv, plan.steps[1].send
    ((Route(direction=0, stage=1, mb=0),), (Route(direction=1, stage=0, mb=0),))
    >>> plan.first_forward, plan.last_backward
    ({1: 0}, {1: 3})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...actions import Action, actions_of
from ...lowering.lower import stage_points
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
    gather: tuple[int, ...] = ()  #: stages whose parameters a sharded rank starts gathering before this op
    free: tuple[int, ...] = ()  #: stages this op is the last of in the step (a sharded stage is released after it)


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


def lower(schedule: Schedule, rank: int) -> RankPlan:
    """Lower ``rank``'s program of ``schedule`` (see the module docstring)."""
    messages = message_plan(schedule)
    program = schedule.programs[rank]
    first, last = messages.first, messages.last
    points = stage_points(program)  # the lowering's rules (stagewise/lowering/lower.py), not a copy of them
    first_fw, last_bw, last_use = points.first_forward, points.last_backward, points.last_use
    split = {(a.stage, a.mb) for op in program for a in actions_of(op) if a.kind == "I"}
    done, gather, free = _at(last_bw), _at(points.gathers), _at(last_use)
    steps = []
    for k, op in enumerate(program):
        acts = tuple(actions_of(op))
        steps.append(Step(op=op, actions=acts, recv=tuple(route_in(a, first, last) for a in acts),
                          send=tuple(route_out(a, first, last) for a in acts), done=done.get(k, ()),
                          gather=gather.get(k, ()), free=free.get(k, ())))
    return RankPlan(rank=rank, schedule=schedule, messages=messages, steps=tuple(steps),
                    stages=tuple(schedule.stages_of_rank(rank)), split=frozenset(split), first_forward=first_fw,
                    last_backward=last_bw)


def _at(points: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """stage -> step index, as step index -> its stages (ascending)."""
    out: dict[int, list[int]] = {}
    for s, k in points.items():
        out.setdefault(k, []).append(s)
    return {k: tuple(sorted(v)) for k, v in out.items()}
