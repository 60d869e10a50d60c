"""Play a lowered schedule: compute on each rank's compute stream, communication on its own resources.

- A send is posted when its op ends and occupies its link (one per sender and receiver, FIFO) for its
  bytes over the cost model's bandwidth; it arrives a latency later (no bytes given: the cost model's
  message time, today's link). Its receive is where the receiver's op takes it: the op starts no earlier.
- A collective runs on its stream (one per rank and group: collectives over one group run in turn), from
  when it is posted (the rank reaches it) and the stream is free, for the network's time
  (``Lowered.duration``). One over several pipeline ranks (tie, step end) starts when every member has
  posted it. An op of a stage waits for the stage's latest gather; a reduction ``during`` its op is posted
  when that op starts and ends no earlier than it. What comes after a rank's last op waits for everything
  the rank posted before it (the optimizer needs the reduced gradients).
- An expert all-to-all is inside its op (the cost model's ``a2a``, ``overlap``): drawn where the op pays it.

Each op starts at max(its rank free, its inputs, its gathers), so, as in ``engine.play``, times do not depend
on the order ranks are advanced in and a work list with wake-ups is exact. With every transfer free the
compute times are ``engine.play``'s exactly. Exposed time of a transfer: what an op (or the step's end)
waited for it beyond everything else it needed; the rest of it was hidden behind compute.
"""

from __future__ import annotations

from collections import deque

from ..actions import Pair, actions_of
from ..costs import Costs, StageCosts
from ..engine import Blocked, Stuck
from ..overlap import Comm, comm_lanes, pair_parts, pair_time
from .comms import ALL_TO_ALL, RECVS, REDUCE_GRAD, SENDS, UNSHARD, CommAction
from .lower import Lowered


def op_time(op, sc: StageCosts) -> float:
    """An op's duration, as ``engine.play`` takes it."""
    if type(op) is Pair:
        fa, ba = op
        if sc.fb is not None:
            return sc.fb[fa.stage]
        if sc.a2a_f is not None:
            return pair_time(*pair_parts(op, sc))
        return sc.f[fa.stage] + sc.compute(ba.kind, ba.stage)
    return sc.duration(op.kind, op.stage)


def a2a_costs(low: Lowered, costs: Costs) -> Costs:
    """``costs`` with the all-to-all time from the lowering's bytes and network, where it gives bytes."""
    from dataclasses import replace

    sizes = low.options.sizes.resolve(low.schedule.stages)
    if low.parallelism.ep < 2 or not any(sizes["a2a"]):
        return costs
    ranks = low.global_ranks(0, "ep")
    inside = low.inside(ranks)
    t = [low.options.network.collective("all-to-all", 2 * b, low.parallelism.ep, inside) for b in sizes["a2a"]]
    return replace(costs, a2a=t, a2a_b=None)


class Played:
    """The times of a lowered play: per rank, aligned with ``Lowered.programs``, (start, end) of every entry
    and the exposed seconds of each communication action. Mutable while playing only."""

    def __init__(self, low: Lowered):
        self.starts = [[0.0] * len(p) for p in low.programs]
        self.ends = [[0.0] * len(p) for p in low.programs]
        self.exposed = [[0.0] * len(p) for p in low.programs]
        #: per rank, compute op position (in the schedule's program) -> the lowered position of the transfer
        #: it waited for last (what held it beyond its rank being free and its inputs computed)
        self.waited: list[dict[int, int]] = [dict() for _ in low.programs]


def play_lowered(low: Lowered, sc: StageCosts, costs: Costs) -> Played:
    """Times of every action of ``low`` (see the module docstring). Raises ``engine.Stuck`` on a deadlock."""
    sched = low.schedule
    m, place = sched.microbatches, sched.placement
    first, last = sched.first_stages, sched.last_stages
    n_keys = sched.stages * m
    programs = low.programs
    R = len(programs)
    out = Played(low)
    done = [-1.0] * (2 * n_keys)  # compute: F done, input gradient done
    arrive: dict = {}  # message key -> (arrival, sent at)
    got: list[dict] = [dict() for _ in range(R)]  # per rank: key -> (arrival, sent at, position of its receive)
    link_free: dict = {}
    stream_free: list[dict] = [dict() for _ in range(R)]
    gathered: list[dict] = [dict() for _ in range(R)]  # stage -> (end of its latest gather, its position)
    entered: dict = {}  # cross-rank collective -> {rank: posted}
    seq: list[dict] = [dict() for _ in range(R)]  # group -> collectives of it entered so far
    last_op = [max((k for k, a in enumerate(p) if type(a) is not CommAction), default=-1) for p in programs]
    comm_end = [0.0] * R  # latest end of what the rank posted
    pos, clock = [0] * R, [0.0] * R
    op_start = [0.0] * R
    waiting: dict = {}
    queue = deque(range(R))
    lat, bw, msg = costs.latency, costs.bandwidth, sc.message
    starts, ends, exposed = out.starts, out.ends, out.exposed

    def wait(key, r):
        waiting.setdefault(key, []).append(r)

    def wake(key):
        if waiting:
            woken = waiting.pop(key, None)
            if woken:
                queue.extend(woken)

    def inputs(r, a):
        """(ready from compute, ready with transfers, position of the transfer that came last) or a key."""
        kind, s, mb = a
        base = comm = 0.0
        via = -1
        deps = []
        if kind == "F":
            if s != first[s]:
                deps.append(((s - 1) * m + mb, ("F", s, mb), s - 1))
        elif kind == "W":
            deps.append((n_keys + s * m + mb, None, s))
        else:
            deps.append((s * m + mb, None, s))
            if s != last[s]:
                deps.append((n_keys + (s + 1) * m + mb, ("B", s, mb), s + 1))
        for k, msg_key, src in deps:
            if place[src] == r or msg_key is None:
                d = done[k]
                if d < 0:
                    return k
                base = max(base, d)
            else:
                g = got[r].get(msg_key)
                if g is None:
                    return ("recv", r, msg_key)
                arrival, sent, where = g
                base = max(base, sent)
                if arrival > comm:
                    comm, via = arrival, where
        return base, comm, via

    compute_at = [[k for k, a in enumerate(p) if type(a) is not CommAction] for p in programs]
    index_of = [{k: j for j, k in enumerate(ks)} for ks in compute_at]
    while queue:
        r = queue.popleft()
        prog = programs[r]
        i, t = pos[r], clock[r]
        n = len(prog)
        while i < n:
            a = prog[i]
            if type(a) is CommAction:
                kind = a.kind
                post = t
                if a.during:
                    post = op_start[r]
                elif i > last_op[r] and kind not in SENDS and kind not in RECVS:
                    post = max(t, comm_end[r])  # after the rank's last op: once what it posted is done
                if kind in SENDS:
                    key = a.key
                    dst = a.peer
                    if bw and a.nbytes > 0:
                        occ, delay = a.nbytes / bw, lat
                    else:
                        occ, delay = 0.0, msg[key[1] - 1 if key[0] == "F" else key[1]]
                    start = max(post, link_free.get((r, dst), 0.0))
                    link_free[(r, dst)] = start + occ
                    arrive[key] = (start + occ + delay, post)
                    starts[r][i], ends[r][i] = start, start + occ + delay
                    wake(("msg", key))
                elif kind in RECVS:
                    key = a.key
                    got_it = arrive.get(key)
                    if got_it is None:
                        wait(("msg", key), r)
                        break
                    got[r][key] = (got_it[0], got_it[1], i)
                    starts[r][i], ends[r][i] = got_it[1], got_it[0]
                    wake(("recv", r, key))
                else:
                    members = low.members(r, a)
                    dur = low.duration(r, a)
                    if len(members) > 1:
                        j = seq[r].get(a.group, 0)
                        inst = (a.group, members, j)
                        posts = entered.setdefault(inst, {})
                        if r not in posts:
                            posts[r] = max(post, stream_free[r].get(a.stream, 0.0))
                            wake(("coll", inst))
                        if len(posts) < len(members):
                            wait(("coll", inst), r)
                            break
                        seq[r][a.group] = j + 1
                        start = max(posts.values())
                    else:
                        start = max(post, stream_free[r].get(a.stream, 0.0))
                    end = start + dur
                    if a.during:  # bucketed: done no earlier than its op, running in the op's last part
                        end = max(end, t)
                        start = end - dur
                    if dur or a.during:
                        stream_free[r][a.stream] = end
                    starts[r][i], ends[r][i] = start, end
                    if kind == UNSHARD:
                        gathered[r][a.stage] = (end, i)
                    if kind != ALL_TO_ALL:
                        comm_end[r] = max(comm_end[r], end)
                i += 1
                continue
            acts = actions_of(a)
            base, comm, via = t, 0.0, -1
            blocked = None
            for x in acts:
                got_in = inputs(r, x)
                if type(got_in) is not tuple or len(got_in) != 3 or got_in[0] == "recv":
                    blocked = got_in
                    break
                b, c, v = got_in
                base = max(base, b)
                if c > comm:
                    comm, via = c, v
                g = gathered[r].get(x.stage)
                if g is not None and g[0] > comm:
                    comm, via = g
            if blocked is not None:
                wait(blocked, r)
                break
            start = max(base, comm)
            if via >= 0 and comm > base:
                exposed[r][via] += comm - base
                out.waited[r][index_of[r][i]] = via
            op_start[r] = start
            t = start + op_time(a, sc)
            starts[r][i], ends[r][i] = start, t
            i += 1
            for kind, s, mb in acts:
                if kind == "W":
                    continue
                k = s * m + mb if kind == "F" else n_keys + s * m + mb
                done[k] = t
                wake(k)
        pos[r], clock[r] = i, t
    if any(pos[r] < len(programs[r]) for r in range(R)):
        raise Stuck(_blocked(low, pos))
    # the step ends when every rank's compute and transfers are done: what runs past the last compute is exposed
    finish = max((ends[r][k] for r in range(R) for k in range(len(programs[r]))
                  if type(programs[r][k]) is not CommAction), default=0.0)
    for r in range(R):
        edge = finish
        for k in sorted((k for k, a in enumerate(programs[r]) if type(a) is CommAction and a.kind not in SENDS
                         and a.kind not in RECVS and ends[r][k] > edge), key=lambda k: ends[r][k]):
            # at most its own length: waiting for the other members of a collective is their lateness
            exposed[r][k] += min(ends[r][k] - edge, ends[r][k] - starts[r][k])
            edge = ends[r][k]
    return out


def _blocked(low: Lowered, pos: list[int]) -> list[Blocked]:
    from ..actions import Action

    out = []
    for r, prog in enumerate(low.programs):
        if pos[r] < len(prog):
            a = prog[pos[r]]
            out.append(Blocked(r, pos[r], a, Action(str(a), -1, -1)))
    return out


def lanes(low: Lowered, played: Played, sc: StageCosts, compute_starts, compute_ends):
    """Per rank, the ``overlap.Comm`` of every transfer with a duration (the all-to-alls as ``overlap`` lays
    them out), kind set; None when there is none."""
    a2a = comm_lanes(low.schedule, sc, compute_starts, compute_ends)
    out, anything = [], False
    for r, prog in enumerate(low.programs):
        lane = list(a2a[r]) if a2a is not None else []
        op = -1
        for k, a in enumerate(prog):
            if type(a) is not CommAction:
                op += 1
                continue
            if a.kind == ALL_TO_ALL:
                continue
            s, e = played.starts[r][k], played.ends[r][k]
            if e > s or played.exposed[r][k] > 0:
                lane.append(Comm(max(op, 0), a, s, e, played.exposed[r][k], a.kind))
        anything = anything or bool(lane)
        out.append(tuple(sorted(lane, key=lambda c: (c.start, c.end))))
    return tuple(out) if anything else None


def compute_times(low: Lowered, played: Played):
    """The compute ops' (starts, ends) per rank, aligned with the schedule's programs."""
    starts, ends = [], []
    for r, prog in enumerate(low.programs):
        starts.append([played.starts[r][k] for k, a in enumerate(prog) if type(a) is not CommAction])
        ends.append([played.ends[r][k] for k, a in enumerate(prog) if type(a) is not CommAction])
    return starts, ends


def simulate_lowered(low: Lowered, costs: Costs | None = None, *, check: bool = True):
    """The ``Timeline`` of a lowered schedule under ``costs``: the compute ops' times (``engine.play``'s when
    every transfer is free), ``comm`` every transfer with a duration, ``meta["lowered"]`` the lowering and
    ``meta["played"]`` the times of all its actions. Raises ``ScheduleError`` for an invalid schedule or a
    deadlock."""
    from ..timeline import Timeline
    from ..validate import ScheduleError, check_structure
    from .check import describe_stuck

    costs = a2a_costs(low, costs or Costs())
    sched = low.schedule
    sc = costs.resolve(sched.stages)
    if check:
        check_structure(sched)
    try:
        played = play_lowered(low, sc, costs)
    except Stuck as stuck:
        raise ScheduleError(describe_stuck(low, stuck)) from None
    starts, ends = compute_times(low, played)
    return Timeline(
        schedule=sched, starts=tuple(map(tuple, starts)), ends=tuple(map(tuple, ends)),
        activation=tuple(sc.activation), activation_bytes=tuple(sc.activation_bytes) if sc.activation_bytes else None,
        free_at_i=sc.free_at_i, cap=tuple(costs.cap.per_rank(sched.ranks)) if costs.cap is not None else None,
        cap_unit=costs.cap.unit if costs.cap is not None else "chunks",
        comm=lanes(low, played, sc, starts, ends), meta={"costs": costs, "lowered": low, "played": played})


__all__ = ["simulate_lowered", "Played", "a2a_costs", "compute_times", "lanes", "op_time", "play_lowered", "REDUCE_GRAD"]
