"""Check a lowered schedule before anything runs it (the validator of communication).

- every send has its receive on the peer, and the receives from one sender come in the order it sends
  (NCCL matches them in order per pair: a receive out of order waits for a message that is not the next);
- every receive is posted before the op that needs it, and each cross-rank input has one;
- every member of a group enters its collectives in the same order (the tie between two pipeline ranks,
  the step end of all of them; replicas over dp, fsdp and ep run the same program);
- a sharded stage is gathered (``UNSHARD``) before each op uses it and not freed (``RESHARD``) before its
  last use; every gather has its free;
- no wait cycle: a rank waits at an op for a message not yet sent, or at a collective for a member not
  there yet; a cycle of such waits is a deadlock, reported with its links.

Errors name the rank, the position in its lowered program, the action and what it waits for.
"""

from __future__ import annotations

from ..actions import actions_of
from ..engine import Stuck
from ..validate import ScheduleError
from ..comm_actions import COLLECTIVES, RECV_B, RECV_F, RECVS, RESHARD, SENDS, UNSHARD, CommAction
from .lower import Lowered
from .rules import message_in
from .stuck import describe_stuck


def check(low: Lowered) -> Lowered:
    """Raise ``ScheduleError`` unless ``low`` is executable; return it."""
    from ..validate import check_structure

    check_structure(low.schedule)
    _check_pairs(low)
    _check_inputs(low)
    _check_collectives(low)
    _check_shards(low)
    _check_deadlock(low)
    return low


def _where(low: Lowered, r: int, k: int) -> str:
    return f"rank {r} position {k} ({low.programs[r][k]})"


def _check_pairs(low: Lowered) -> None:
    """Sends and receives per (sender, receiver) pair: the same messages, in the same order."""
    sends: dict = {}
    recvs: dict = {}
    for r, prog in enumerate(low.programs):
        for k, a in enumerate(prog):
            if type(a) is CommAction and a.kind in SENDS:
                sends.setdefault((r, a.peer), []).append((a.key, k))
            elif type(a) is CommAction and a.kind in RECVS:
                recvs.setdefault((a.peer, r), []).append((a.key, k))
    for pair in sorted(set(sends) | set(recvs)):
        src, dst = pair
        ss, rr = sends.get(pair, []), recvs.get(pair, [])
        for j in range(max(len(ss), len(rr))):
            if j >= len(rr):
                raise ScheduleError(f"{_where(low, src, ss[j][1])}: no receive on rank {dst} takes it (every "
                                    f"send needs its receive on the peer)")
            if j >= len(ss):
                raise ScheduleError(f"{_where(low, dst, rr[j][1])}: rank {src} sends no such message to rank "
                                    f"{dst} (every receive needs its send)")
            if ss[j][0] != rr[j][0]:
                raise ScheduleError(
                    f"deadlock: receive order: {_where(low, dst, rr[j][1])} is receive {j} from rank {src}, but "
                    f"rank {src}'s send {j} to rank {dst} is {_where(low, src, ss[j][1])}; receives from one "
                    "sender must come in its send order (NCCL matches them in order)")


def _check_inputs(low: Lowered) -> None:
    """Each op that needs a message from another rank has its receive before it, and each send follows the op
    that makes its data."""
    sched = low.schedule
    place, first, last = sched.placement, sched.first_stages, sched.last_stages
    for r, prog in enumerate(low.programs):
        posted, made = set(), set()
        for k, a in enumerate(prog):
            if type(a) is CommAction:
                if a.kind in RECVS:
                    posted.add(a.key)
                elif a.kind in SENDS:
                    src = (a.kind, a.stage, a.mb)
                    if src not in made:
                        raise ScheduleError(f"{_where(low, r, k)}: sends before the op that computes it")
                continue
            for act in actions_of(a):
                kind, s, mb = act
                made.add(("SEND_F" if kind == "F" else "SEND_B", s, mb))
                got = message_in(act, first, last)
                if got is not None and place[got[1]] != r and got[0] not in posted:
                    recv = f"{s}{RECV_F if kind == 'F' else RECV_B}{mb}"
                    raise ScheduleError(f"{_where(low, r, k)}: needs {recv} from rank {place[got[1]]}, which is "
                                        "not posted before it")


def _check_collectives(low: Lowered) -> None:
    """Members of a group that spans pipeline ranks enter its collectives in the same order."""
    seqs: dict = {}
    for r, prog in enumerate(low.programs):
        for k, a in enumerate(prog):
            if type(a) is CommAction and a.kind in COLLECTIVES:
                members = low.members(r, a)
                if len(members) > 1:
                    seqs.setdefault((a.group, members), {}).setdefault(r, []).append((a.kind, k))
    for (group, members), per in sorted(seqs.items()):
        missing = [r for r in members if r not in per]
        if missing:
            r0 = min(per)
            raise ScheduleError(f"{_where(low, r0, per[r0][0][1])}: a {group} collective of ranks {list(members)}, "
                                f"but rank {missing[0]} never enters it (deadlock: the others wait for it)")
        ref_r = members[0]
        ref = per[ref_r]
        for r in members[1:]:
            mine = per[r]
            for j in range(max(len(ref), len(mine))):
                a = ref[j] if j < len(ref) else None
                b = mine[j] if j < len(mine) else None
                if a is None or b is None or a[0] != b[0]:
                    here = _where(low, r, b[1]) if b else f"rank {r} (nothing)"
                    there = _where(low, ref_r, a[1]) if a else f"rank {ref_r} (nothing)"
                    raise ScheduleError(f"deadlock: collective order over {group}: {here} is collective {j}, but "
                                        f"{there} is; every member enters a group's collectives in one order")


def _check_shards(low: Lowered) -> None:
    """Gathered before use, freed after the last use, every gather freed (stages that are sharded at all)."""
    sharded = {(r, a.stage) for r, prog in enumerate(low.programs) for a in prog
               if type(a) is CommAction and a.kind in (UNSHARD, RESHARD) and a.group in ("fsdp",)}
    if not sharded:
        return
    for r, prog in enumerate(low.programs):
        state: dict[int, bool] = {}
        for k, a in enumerate(prog):
            if type(a) is CommAction:
                if a.kind == UNSHARD and a.group == "fsdp":
                    state[a.stage] = True
                elif a.kind == RESHARD:
                    if not state.get(a.stage):
                        raise ScheduleError(f"{_where(low, r, k)}: frees stage {a.stage}, which is not gathered")
                    state[a.stage] = False
                continue
            for x in actions_of(a):
                if (r, x.stage) in sharded and not state.get(x.stage):
                    raise ScheduleError(f"{_where(low, r, k)}: uses stage {x.stage} while it is not gathered "
                                        f"(an {x.stage}UNSHARD must come before, with no {x.stage}RESHARD between)")
        left = sorted(s for s, on in state.items() if on)
        if left:
            raise ScheduleError(f"rank {r}: stage {left[0]} is gathered at the end of the step ({left[0]}RESHARD "
                                "missing after its last use)")


def _check_deadlock(low: Lowered) -> None:
    from ..costs import Costs
    from .play import play_lowered

    costs = Costs()
    try:
        play_lowered(low, costs.resolve(low.schedule.stages, low.schedule.slices), costs)
    except Stuck as stuck:
        raise ScheduleError(describe_stuck(low, stuck)) from None
