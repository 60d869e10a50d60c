"""Prove a schedule executable before anything runs it.

Checks, in order: indices in range, each stage on its one rank, each
(stage, mb, kind) exactly once, every micro-batch complete (F and either B or
I+W), with sequence slices each stage's slices in their order (a slice's
forward after the previous slice's, its backward after the next slice's), and
no deadlock. Messages name the rank, the position in its program, the action
and, for a deadlock, the cycle of waits.
"""

from __future__ import annotations

from collections import namedtuple

from .actions import GRAD_KINDS, Action, Pair, actions_of
from .costs import Costs
from .engine import Blocked, Stuck, play
from .schedule import Schedule
from .errors import StagewiseError

_KIND_INDEX = {"F": 0, "B": 1, "I": 2, "W": 3}


class ScheduleError(StagewiseError):
    """A schedule that cannot be executed; the message says where and why."""


def validate(schedule: Schedule) -> Schedule:
    """Raise ``ScheduleError`` unless ``schedule`` is executable; return it."""
    check_structure(schedule)
    try:
        play(schedule, Costs().resolve(schedule.stages))
    except Stuck as stuck:
        raise ScheduleError(describe_deadlock(schedule, stuck)) from None
    return schedule


def check_structure(schedule: Schedule) -> None:
    """Everything but deadlock: ranges, placement, each action exactly once."""
    S, m = schedule.stages, schedule.microbatches
    if S == 0 or m <= 0:
        raise ScheduleError(f"schedule has {S} stages and {m} micro-batches; both must be >= 1")
    if any(not 0 <= r < schedule.ranks for r in schedule.placement):
        raise ScheduleError(f"placement {schedule.placement} names a rank outside 0..{schedule.ranks - 1}")
    lane_mb = [(lane.mb_lo, lane.mb_hi) for lane in schedule.lanes for _ in lane.stages]
    if len(lane_mb) != S:
        raise ScheduleError(f"lanes cover {len(lane_mb)} stages; the placement has {S}")
    seen = bytearray(4 * S * m)
    placement = schedule.placement
    lo_of = [lo for lo, _ in lane_mb]
    hi_of = [hi for _, hi in lane_mb]
    kind_base = {k: i * S * m for k, i in _KIND_INDEX.items()}
    if schedule.slices != 1:
        _check_slice_counts(schedule)
    for r, prog in enumerate(schedule.programs):
        for pos, op in enumerate(prog):
            if type(op) is Pair:
                _check_pair(op, r, pos)
                actions = op
            else:
                kind, s, mb = op
                # fast path, the common op: every check is one comparison; messages only on failure
                base = kind_base.get(kind)
                if base is not None and 0 <= s < S and lo_of[s] <= mb < hi_of[s] and placement[s] == r:
                    k = base + s * m + mb
                    if not seen[k]:
                        seen[k] = 1
                        continue
                actions = (op,)
            for a in actions:
                _check_action(schedule, r, pos, op, a, lane_mb, seen, kind_base)
    _check_complete(schedule, seen)
    if schedule.slices > 1:
        _check_slice_order(schedule)


def _check_slice_counts(schedule: Schedule) -> None:
    k = schedule.slices
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ScheduleError(f"slices must be a whole number >= 1; got {k!r}")
    for lane in schedule.lanes:
        if lane.mb_lo % k or lane.mb_hi % k:
            raise ScheduleError(f"units {lane.mb_lo}..{lane.mb_hi - 1} of stages {lane.stage_lo}..{lane.stage_hi - 1}"
                                f" are not whole micro-batches of {k} slices (a lane's units must start and end at a "
                                "multiple of slices)")


def _check_slice_order(schedule: Schedule) -> None:
    """On every stage, slice j's forward after slice j-1's (the keys and values it attends to) and slice j's backward
    (B or I) before slice j-1's (the gradient of those keys and values, handed back); both on the stage's rank, so
    its program order says it."""
    k, where = schedule.slices, _locate(schedule)
    for (kind, s, u), (r, pos) in where.items():
        j = u % k
        if kind == "F" and j > 0:
            before, why = ("F", s, u - 1), f"its forward attends to the keys and values of slice {j - 1}'s"
        elif kind in GRAD_KINDS and j < k - 1:
            before = next((x for x in (("B", s, u + 1), ("I", s, u + 1)) if x in where), None)
            why = f"its backward needs the gradient of its keys and values from slice {j + 1}'s"
            if before is None:
                continue  # a missing backward was named by _check_complete
        else:
            continue
        at = where[before][1]
        if at >= pos:
            op = schedule.programs[r][pos]
            raise ScheduleError(
                f"rank {r} position {pos} ({op}): slice {j} of micro-batch {u // k} runs {Action(kind, s, u)} before "
                f"{Action(*before)} (position {at}): {why} on stage {s}, which must run first")


def _check_action(schedule: Schedule, r: int, pos: int, op, a: Action, lane_mb, seen: bytearray,
                  kind_base: dict) -> None:
    """Mark ``a`` (of ``op`` at ``pos`` on rank ``r``) as seen, or raise what is wrong with it."""
    kind, s, mb = a
    if kind not in kind_base:
        raise ScheduleError(f"rank {r} position {pos} ({op}): unknown kind {kind!r}; one of {', '.join(kind_base)}")
    S, m = schedule.stages, schedule.microbatches
    lo, hi = lane_mb[s] if 0 <= s < S else (0, 0)
    if not (0 <= s < S and lo <= mb < hi and schedule.placement[s] == r):
        _raise_bad_index(schedule, r, pos, op, Action(kind, s, mb), lane_mb)
    k = kind_base[kind] + s * m + mb
    if seen[k]:
        raise ScheduleError(f"rank {r} position {pos} ({op}): duplicate action {Action(kind, s, mb)}; "
                            "each (stage, micro-batch, kind) runs once")
    seen[k] = 1


def _raise_bad_index(schedule: Schedule, r: int, pos: int, op, a: Action, lane_mb) -> None:
    where = f"rank {r} position {pos} ({op})"
    S = schedule.stages
    if not 0 <= a.stage < S:
        raise ScheduleError(f"{where}: stage {a.stage} out of range 0..{S - 1}")
    lo, hi = lane_mb[a.stage]
    if not lo <= a.mb < hi:
        raise ScheduleError(f"{where}: micro-batch {a.mb} out of range {lo}..{hi - 1} for stage {a.stage}")
    raise ScheduleError(f"{where}: stage {a.stage} belongs to rank {schedule.placement[a.stage]}, not rank {r}")


def _check_pair(op: Pair, r: int, pos: int) -> None:
    if op.forward.kind != "F" or op.backward.kind not in ("B", "I"):
        raise ScheduleError(f"rank {r} position {pos} ({op}): an overlapped pair is one F and one B or I")


def _check_complete(schedule: Schedule, seen: bytearray) -> None:
    S, m = schedule.stages, schedule.microbatches
    for lane in schedule.lanes:
        n = lane.mb_hi - lane.mb_lo
        ones, zeros = b"\x01" * n, bytes(n)
        for s in lane.stages:
            f, b, i, w = (seen[(k * S + s) * m + lane.mb_lo:(k * S + s) * m + lane.mb_hi] for k in range(4))
            if f == ones and ((b == ones and i == w == zeros) or (b == zeros and i == w == ones)):
                continue  # fast path: the whole stage is complete one way or the other
            rank = schedule.placement[s]
            for mb in lane.mbs:
                f, b, i, w = (seen[(k * S + s) * m + mb] for k in range(4))
                problem = None
                if not f:
                    problem = f"missing {Action('F', s, mb)}"
                elif b and (i or w):
                    problem = f"{Action('B', s, mb)} together with a split backward ({Action('I', s, mb)}/{Action('W', s, mb)})"
                elif not b and not (i or w):
                    problem = f"missing the backward of stage {s} micro-batch {mb} ({Action('B', s, mb)}, or {Action('I', s, mb)} and {Action('W', s, mb)})"
                elif i != w:
                    problem = f"missing {Action('W' if i else 'I', s, mb)} (split backward needs both I and W)"
                if problem:
                    raise ScheduleError(f"rank {rank}: {problem}")


class Wait(namedtuple("Wait", ("blocked", "target"))):
    """One link of a deadlock: ``blocked`` (a ``Blocked``) waits for ``waits_for``, which sits at ``target``
    ((rank, position), or None)."""

    __slots__ = ()


def wait_cycle(schedule: Schedule, stuck: Stuck) -> tuple[list[Wait], bool]:
    """The waits from the first blocked rank on, until a rank repeats: the cycle (True), or the chain
    to a rank that is not blocked (False). The validator's message and the workshop's drawing of it."""
    head = {b.rank: b for b in stuck.blocked}
    where = _locate(schedule)
    chain: list[Wait] = []
    visited: list[int] = []
    r = stuck.blocked[0].rank
    while r in head and r not in visited:
        visited.append(r)
        target = _find_dep(where, head[r].waits_for)
        chain.append(Wait(head[r], target))
        r = target[0] if target else None
    if r in visited:
        return chain[visited.index(r):], True
    return chain, False


def describe_deadlock(schedule: Schedule, stuck: Stuck) -> str:
    """The cycle of waits, as 'rank r position i (op) waits for X on rank q' links."""
    waits, cycle = wait_cycle(schedule, stuck)
    where = _locate(schedule)
    links = "; ".join(f"rank {w.blocked.rank} position {w.blocked.position} ({w.blocked.op}) waits for "
                      f"{target_text(w.blocked.waits_for, where)}{slice_reason(schedule, w.blocked)}" for w in waits)
    if cycle:
        return f"deadlock: wait cycle: {links}; back to rank {waits[0].blocked.rank}"
    return f"deadlock: {links}"


def slice_reason(schedule: Schedule, blocked: Blocked) -> str:
    """Why a wait for a neighbour slice on the same stage is there, in words ('' for any other wait)."""
    dep, k = blocked.waits_for, schedule.slices
    ops = [a for a in actions_of(blocked.op) if a.stage == dep.stage] if k > 1 and dep.stage >= 0 else []
    for a in ops:
        if dep.kind == "F" and a.kind == "F" and dep.mb == a.mb - 1 and a.mb % k:
            return f" (slice {a.mb % k - 1}'s forward: the keys and values slice {a.mb % k} attends to)"
        if dep.kind == "B|I" and a.kind in GRAD_KINDS and dep.mb == a.mb + 1 and dep.mb % k:
            return f" (slice {dep.mb % k}'s backward: the gradient of slice {a.mb % k}'s keys and values)"
    return ""


def target_text(dep: Action, where: dict) -> str:
    loc = _find_dep(where, dep)
    if loc is None:
        return str(dep)
    r, pos = loc
    return f"{_name(dep, where)} at rank {r} position {pos}"


def _name(dep: Action, where: dict) -> str:
    if dep.kind != "B|I":
        return str(dep)
    for kind in ("B", "I"):
        if (kind, dep.stage, dep.mb) in where:
            return str(Action(kind, dep.stage, dep.mb))
    return f"{dep.stage}B{dep.mb}"


def _find_dep(where: dict, dep: Action):
    if dep.kind == "B|I":
        return where.get(("B", dep.stage, dep.mb)) or where.get(("I", dep.stage, dep.mb))
    return where.get(tuple(dep))


def _locate(schedule: Schedule) -> dict:
    where = {}
    for r, prog in enumerate(schedule.programs):
        for pos, op in enumerate(prog):
            for a in actions_of(op):
                where[tuple(a)] = (r, pos)
    return where
