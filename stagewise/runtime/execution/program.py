"""One rank's lowered program: what the executor walks, action by action.

A schedule says only what each rank computes, in order (F, B, I, W, F&B). The core lowering
(``stagewise.lowering.lower``, under the run's ``Parallelism`` and the framework's ``Overlap``) adds the
communication each rank performs: receives before an op, sends after it, FSDP's UNSHARD before and RESHARD
after, REDUCE_GRAD after a stage's last backward, the all-to-alls inside an MoE op, the tie and the step end
after the last op, and the headers of the messages whose shapes the receiver learns (``headers``: the first
of each boundary, every message for micro-batches of different shapes, or none once static shapes are
learned). ``lower(schedule, rank, parallelism)`` is that program as it is (the simulator's, the
validator's and the pictures' program), with the rank's message channels read from its own SENDs, RECVs and
headers (``p2p.Channels``) and the stage facts the compute handler needs. No torch here.

Example:
    >>> from stagewise.schedules import generate
    >>> from stagewise.parallelism import Parallelism
    >>> plan = lower(generate("1f1b", 2, 2), rank=1, parallelism=Parallelism(pp=2, dp=2))
    >>> " ".join(map(str, plan.program))
    '1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD 1STEP_END'
    >>> plan.messages.inbound
    {0: (Route(direction=0, stage=1, mb=0), Route(direction=0, stage=1, mb=1))}
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...actions import OFFLOAD, RECOMPUTE, actions_of
from ...comm_actions import TIE_GRAD, CommAction
from ...lowering.lower import lower as lower_comms
from ...lowering.options import FRAMEWORKS, LoweringOptions, Overlap, Sizes
from ...lowering.rules import stage_points
from ...parallelism import Parallelism
from ...schedule import Schedule
from ..messages.p2p import Channels, channels


@dataclass(frozen=True, kw_only=True)
class RankPlan:
    """A rank's lowered program. Immutable: derived once per (schedule, rank); the same on every replica."""

    rank: int  #: the rank of the schedule's programs (the pipeline rank)
    schedule: Schedule
    program: tuple  #: the lowered program: compute ops (Action, Pair) and CommActions, in order
    messages: Channels  #: the rank's sends and receives per peer, in the program's order
    stages: tuple[int, ...]  #: the stages this rank holds, ascending
    split: frozenset  #: (stage, mb) whose backward is split (I then W) on this rank
    last_backward: dict  #: stage -> index of the compute op after which its weight gradients are complete
    tie_sets: frozenset = frozenset()  #: the pipeline ranks of each TIE_GRAD of every rank's program
    offloaded: frozenset = frozenset()  #: (stage, mb) with an OFFLOAD on this rank: its F records what it saves
    recomputed: frozenset = frozenset()  #: (stage, mb) with a RECOMPUTE on this rank: its F keeps only its input

    @property
    def split_stages(self) -> frozenset[int]:
        """Stages that run an I somewhere (split backward: their holder outputs are recorded)."""
        return frozenset(s for s, _ in self.split)

    def is_first(self, stage: int) -> bool:
        """``stage`` starts its lane (takes the inputs)."""
        return stage == self.schedule.first_stages[stage]

    def is_last(self, stage: int) -> bool:
        """``stage`` ends its lane (computes the loss)."""
        return stage == self.schedule.last_stages[stage]


def lower(schedule: Schedule, rank: int, parallelism: Parallelism | None = None,
          overlap: Overlap | None = None, exchanging: frozenset = frozenset(), tie: bool = False,
          headers: str = "none") -> RankPlan:
    """``rank``'s program of ``schedule`` lowered under ``parallelism`` (default: the pipeline alone) and
    ``overlap`` (default: stagewise's own rule); ``exchanging``: the stages whose F, B and I all-to-all over ep
    (their ALL_TO_ALLs are in the program); ``tie``: a weight tied across each lane's first and last stage
    (its all-reduce is a TIE_GRAD of the program); ``headers``: which messages carry a header
    (``LoweringOptions.headers``)."""
    par = replace(parallelism or Parallelism(), pp=schedule.ranks)  # the schedule's ranks are the pipeline
    a2a = [1.0 if s in exchanging else 0.0 for s in range(schedule.stages)]
    low = lower_comms(schedule, par, LoweringOptions(overlap=overlap or FRAMEWORKS["stagewise"],
                                                     sizes=Sizes(a2a=a2a, tie=1.0 if tie else 0.0),
                                                     headers=headers))
    program = low.programs[rank]
    compute = schedule.programs[rank]
    return RankPlan(rank=rank, schedule=schedule, program=program,
                    messages=channels(program, schedule.stages, schedule.microbatches),
                    stages=tuple(schedule.stages_of_rank(rank)),
                    split=frozenset((a.stage, a.mb) for op in compute for a in actions_of(op) if a.kind == "I"),
                    last_backward=stage_points(compute).last_backward,
                    tie_sets=frozenset(frozenset((r, a.peer)) for r, prog in enumerate(low.programs)
                                       for a in prog if type(a) is CommAction and a.kind == TIE_GRAD),
                    offloaded=_memory(compute, OFFLOAD), recomputed=_memory(compute, RECOMPUTE))


def _memory(compute: tuple, kind: str) -> frozenset:
    """The (stage, mb) of ``kind``'s memory actions in a compute program."""
    return frozenset((op.stage, op.mb) for op in compute if op.kind == kind)
