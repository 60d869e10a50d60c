"""The schedule: one program per rank plus the stage-to-rank placement.

Every micro-batch flows through a *lane*: a contiguous range of stages it
visits in order. Ordinary schedules have one lane covering all stages and all
micro-batches. DualPipe has two lanes (one per direction), each a whole copy of
the model cut into ``ranks`` stages, and each fed half of the micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter
from collections.abc import Iterator

from . import display
from .actions import MEMORY_KINDS, Action, Op, Pair, actions_of


@dataclass(frozen=True, kw_only=True)
class Lane:
    """Micro-batches ``mb_lo..mb_hi-1`` visit stages ``stage_lo..stage_hi-1`` in order."""

    stage_lo: int
    stage_hi: int
    mb_lo: int
    mb_hi: int

    @property
    def stages(self) -> range:
        return range(self.stage_lo, self.stage_hi)

    @property
    def mbs(self) -> range:
        return range(self.mb_lo, self.mb_hi)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Programs of all ranks, the placement, and the micro-batch routes.

    ``placement[s]`` is the rank that holds stage ``s``. ``lanes`` default to
    one lane over all stages and micro-batches.
    """

    name: str
    programs: tuple[tuple[Op, ...], ...]
    placement: tuple[int, ...]
    microbatches: int
    lanes: tuple[Lane, ...] = ()
    #: sequence slices per micro-batch (Seq1F1B): ``microbatches`` counts pipeline units, ``mb`` of an action is
    #: a unit ``u`` of micro-batch ``u // slices``, slice ``u % slices`` (``stagewise.slices``)
    slices: int = 1
    #: stages of one model copy (S in the papers); equals len(placement) except for DualPipe
    params: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.lanes:
            lane = Lane(stage_lo=0, stage_hi=self.stages, mb_lo=0, mb_hi=self.microbatches)
            object.__setattr__(self, "lanes", (lane,))

    @property
    def ranks(self) -> int:
        return len(self.programs)

    @property
    def stages(self) -> int:
        return len(self.placement)

    @property
    def chunks(self) -> int:
        """Stages per rank (v)."""
        return max(1, self.stages // max(1, self.ranks))

    @property
    def num_actions(self) -> int:
        return sum(len(p) for p in self.programs)

    @cached_property
    def memory_actions(self) -> bool:
        """Whether a program holds a memory action (``actions.MEMORY_KINDS``): then memory and busy time are read
        off the played times (an OFFLOAD frees when its transfer ends, on the host stream beside compute)."""
        kinds = frozenset(MEMORY_KINDS)
        return any(not kinds.isdisjoint(map(itemgetter(0), prog)) for prog in self.programs)

    @property
    def num_compute_actions(self) -> int:
        """Plain actions, counting both halves of an overlapped pair."""
        return self.num_actions + sum(1 for prog in self.programs for op in prog if type(op) is Pair)

    @property
    def stages_per_copy(self) -> int:
        """Stages of one model copy (S in the papers): a lane's length (DualPipe: half the stages)."""
        return self.lanes[0].stage_hi - self.lanes[0].stage_lo

    @property
    def first_stages(self) -> tuple[int, ...]:
        """Per stage, the first stage of its lane (where the lane's inputs enter)."""
        return tuple(self.lane_of_stage(s).stage_lo for s in range(self.stages))

    @property
    def last_stages(self) -> tuple[int, ...]:
        """Per stage, the last stage of its lane (where the loss is computed)."""
        return tuple(self.lane_of_stage(s).stage_hi - 1 for s in range(self.stages))

    def lane_of_stage(self, stage: int) -> Lane:
        for lane in self.lanes:
            if lane.stage_lo <= stage < lane.stage_hi:
                return lane
        raise IndexError(stage)

    @property
    def split_backward(self) -> bool:
        return any(a.kind == "I" for a in self.actions())

    def actions(self) -> Iterator[Action]:
        for prog in self.programs:
            for op in prog:
                yield from actions_of(op)

    def stages_of_rank(self, rank: int) -> list[int]:
        """The stages ``rank`` holds, ascending (a new list each call)."""
        return list(self._rank_stages.get(rank, ()))

    @cached_property
    def _rank_stages(self) -> dict[int, tuple[int, ...]]:
        # asked per rank per candidate by the planner: read the placement once (the value is immutable)
        out: dict[int, list[int]] = {}
        for s, r in enumerate(self.placement):
            out.setdefault(r, []).append(s)
        return {r: tuple(v) for r, v in out.items()}

    def param_share(self) -> list[float]:
        """Fraction of one whole model whose parameters each rank holds."""
        share = [0.0] * self.ranks
        for s, r in enumerate(self.placement):
            lane = self.lane_of_stage(s)
            share[r] += 1.0 / (lane.stage_hi - lane.stage_lo)
        return share

    def forward_only(self) -> "Schedule":
        """The same placement and lanes with each rank's forwards only, in program order (evaluation).

        Executable whenever the schedule is: a forward waits only on forwards, which ran in this order before.
        """
        progs = tuple(tuple(a for op in prog for a in actions_of(op) if a.kind == "F") for prog in self.programs)
        return Schedule(name=f"{self.name} (forward only)", programs=progs, placement=self.placement,
                        microbatches=self.microbatches, lanes=self.lanes, slices=self.slices,
                        params=dict(self.params))

    def _repr_html_(self) -> str:  # Jupyter: simulated at the seed costs (stagewise.display)
        return display.draw(self, "html")

    def _repr_svg_(self) -> str | None:
        return display.draw(self, "svg")

    def __str__(self) -> str:
        return "\n".join(
            f"rank {r}: " + " ".join(str(op) for op in prog) for r, prog in enumerate(self.programs)
        )


def infer_placement(programs: tuple[tuple[Op, ...], ...]) -> tuple[int, ...]:
    """Placement read off the programs (for imported schedules).

    Raises ``ValueError`` when a stage is found on two ranks.
    """
    seen: dict[int, tuple[int, int, Op]] = {}
    for r, prog in enumerate(programs):
        for pos, op in enumerate(prog):
            for a in actions_of(op):
                prev = seen.setdefault(a.stage, (r, pos, op))
                if prev[0] != r:
                    raise ValueError(
                        f"stage {a.stage} is on two ranks: rank {prev[0]} position {prev[1]} "
                        f"({prev[2]}) and rank {r} position {pos} ({op}); each stage must be on "
                        "exactly one rank"
                    )
    if not seen:
        return ()
    stages = max(seen) + 1
    missing = [s for s in range(stages) if s not in seen]
    if missing:
        raise ValueError(f"stage {missing[0]} has no action on any rank (stages run 0..{stages - 1})")
    return tuple(seen[s][0] for s in range(stages))


def make(name: str, programs, placement, microbatches: int, lanes=(), slices: int = 1, **params) -> Schedule:
    """Build a Schedule from lists (generators' convenience)."""
    return Schedule(
        name=name,
        programs=tuple(tuple(p) for p in programs),
        placement=tuple(placement),
        microbatches=microbatches,
        lanes=tuple(lanes),
        slices=slices,
        params=params,
    )


__all__ = ["Lane", "Schedule", "infer_placement", "make", "Action", "Pair"]
