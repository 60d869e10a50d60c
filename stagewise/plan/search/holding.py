"""How a schedule holds the model: which rank runs each piece, how often, how many in flight.

The partitioner cuts the model into *pieces* (the stages of one model copy);
a schedule's stages map onto pieces through its lanes (DualPipe's second lane
is a second copy of the same pieces). What the partitioner needs from the
schedule is read off its programs here, so no family gets its own code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import ge

from ...actions import Pair
from ...schedule import Schedule


@dataclass(frozen=True, kw_only=True)
class Holding:
    """The schedule-side inputs of a partition."""

    pieces: int  #: stages of one model copy
    ranks: int
    stage_piece: tuple[int, ...]  #: schedule stage -> piece of the model it runs
    stage_rank: tuple[int, ...]  #: schedule stage -> rank (the placement)
    stage_share: tuple[float, ...]  #: share of the step's micro-batches that pass this stage
    #: per rank, the activation counts live at each possible peak, one per stage of the rank
    #: (ordered as ``rank_stages``); dominated vectors dropped
    live: tuple[tuple[tuple[int, ...], ...], ...]
    rank_stages: tuple[tuple[int, ...], ...]

    @property
    def one_stage_per_rank(self) -> bool:
        """Each rank runs one piece once: the partition problem a DP solves exactly."""
        return len(self.stage_piece) == self.pieces and sorted(self.stage_rank) == list(range(self.ranks))

    def rank_pieces(self, rank: int) -> list[int]:
        return [self.stage_piece[s] for s in self.rank_stages[rank]]


def holding(schedule: Schedule) -> Holding:
    """The Holding of ``schedule`` (activations freed at B, or at W for a split backward)."""
    piece, share = [0] * schedule.stages, [0.0] * schedule.stages
    pieces = 0
    first = schedule.first_stages
    for lane in schedule.lanes:
        pieces = max(pieces, len(lane.stages))
        for s in lane.stages:
            piece[s] = s - first[s]
            share[s] = (lane.mb_hi - lane.mb_lo) / schedule.microbatches
    rank_stages = tuple(tuple(schedule.stages_of_rank(r)) for r in range(schedule.ranks))
    live = tuple(_live_vectors(prog, stages) for prog, stages in zip(schedule.programs, rank_stages))
    return Holding(pieces=pieces, ranks=schedule.ranks, stage_piece=tuple(piece),
                   stage_rank=tuple(schedule.placement), stage_share=tuple(share), live=live,
                   rank_stages=rank_stages)


def _live_vectors(program, stages: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Live activation counts per stage at each local peak (a forward not followed by one)."""
    if len(stages) == 1:
        return _live_one(program)
    if len(stages) == 2:
        return _live_two(program, stages)
    index = {s: k for k, s in enumerate(stages)}
    live = [0] * len(stages)
    peaks: set[tuple[int, ...]] = set()
    rising = False
    for op in program:
        if type(op) is Pair:
            live[index[op.forward.stage]] += 1
            peaks.add(tuple(live))
            rising = False
            if op.backward.kind == "B":
                live[index[op.backward.stage]] -= 1
            continue
        kind, s, _ = op
        if kind == "F":
            live[index[s]] += 1
            rising = True
            continue
        if rising:
            peaks.add(tuple(live))
            rising = False
        if kind in ("B", "W"):
            live[index[s]] -= 1
    if rising:
        peaks.add(tuple(live))
    ordered = sorted(peaks, key=sum, reverse=True)
    kept: list[tuple[int, ...]] = []
    for v in ordered:  # a vector can only be dominated by one with a larger or equal sum
        if not any(all(map(ge, u, v)) for u in kept):  # u dominates v: every count at least v's
            kept.append(v)
    return tuple(sorted(kept))


def _live_one(program) -> tuple[tuple[int, ...], ...]:
    """``_live_vectors`` of a rank holding one stage: its one undominated peak is the largest count."""
    live = peak = 0
    for op in program:
        if type(op) is Pair:
            live += 1
            if live > peak:
                peak = live
            if op.backward.kind == "B":
                live -= 1
            continue
        kind = op.kind
        if kind == "F":
            live += 1
            if live > peak:
                peak = live
        elif kind != "I":
            live -= 1
    return ((peak,),) if peak else ()


def _live_two(program, stages: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``_live_vectors`` of a rank holding two stages (the V-shapes, DualPipe, v = 2): the same scan on two
    counters, and the undominated peaks as a staircase (by the first count, largest first, each kept if its
    second count beats every one before it) instead of the pairwise check."""
    first = stages[0]
    a = b = 0
    peaks: set[tuple[int, int]] = set()
    rising = False
    for op in program:
        if type(op) is Pair:
            if op.forward.stage == first:
                a += 1
            else:
                b += 1
            peaks.add((a, b))
            rising = False
            if op.backward.kind == "B":
                if op.backward.stage == first:
                    a -= 1
                else:
                    b -= 1
            continue
        kind, s, _ = op
        if kind == "F":
            if s == first:
                a += 1
            else:
                b += 1
            rising = True
            continue
        if rising:
            peaks.add((a, b))
            rising = False
        if kind == "B" or kind == "W":
            if s == first:
                a -= 1
            else:
                b -= 1
    if rising:
        peaks.add((a, b))
    kept, best = [], -1
    for v in sorted(peaks, reverse=True):
        if v[1] > best:
            kept.append(v)
            best = v[1]
    return tuple(sorted(kept))
