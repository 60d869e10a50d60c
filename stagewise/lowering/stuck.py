"""Why a lowered play is stuck: the wait cycle of its blocked ranks, in words (``ScheduleError``'s message).

Its own module because both ``play`` (which raises when a lowered schedule deadlocks) and ``check`` (which
plays a lowering to find one) say it, and ``check`` plays through ``play``: here, below both, no circle.
"""

from __future__ import annotations

from ..actions import actions_of
from ..engine import Stuck
from ..comm_actions import HEADER_RECVS, RECVS, CommAction
from .lower import Lowered
from .rules import message_in


def describe_stuck(low: Lowered, stuck: Stuck) -> str:
    """The wait cycle of a stuck lowered play: each blocked rank, what it waits at, and whose move that is."""
    heads = {b.rank: b for b in stuck.blocked}
    links, seen = [], []
    r = stuck.blocked[0].rank
    while r in heads and r not in seen:
        seen.append(r)
        b = heads[r]
        a = low.programs[r][b.position]
        other = _waits_on(low, r, a)
        what = (f"rank {other}" if other is not None else "an action no rank runs")
        links.append(f"rank {r} position {b.position} ({a}) waits for {what}")
        r = other
    cycle = r in seen
    text = "; ".join(links[seen.index(r):] if cycle else links)
    return f"deadlock: wait cycle: {text}; back to rank {r}" if cycle else f"deadlock: {text}"


def _waits_on(low: Lowered, r: int, a) -> int | None:
    sched = low.schedule
    place, first, last = sched.placement, sched.first_stages, sched.last_stages
    if type(a) is CommAction:
        if a.kind in RECVS or a.kind in HEADER_RECVS:
            return a.peer
        members = [x for x in low.members(r, a) if x != r]
        return members[0] if members else None
    for act in actions_of(a):
        got = message_in(act, first, last)
        if got is not None and place[got[1]] != r:
            return place[got[1]]
    return None
