"""Play a lowered schedule: compute on each rank's compute stream, communication on its own resources.

- A send is posted when its op ends and occupies its link (one per sender and receiver, FIFO) for its
  bytes over the cost model's bandwidth; it arrives a latency later (no bytes given: the cost model's
  message time, today's link). Its receive is where the receiver's op takes it: the op starts no earlier.
  With ``Overlap.blocking_p2p`` (DeepSpeed) the sender's next op waits for the arrival too.
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
from .comms import ALL_TO_ALL, RECVS, SENDS, UNSHARD, CommAction
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
    player = _Player(low, sc, costs)
    player.run()
    player.tail()
    return player.out


class _Player:
    """One play of a lowered schedule. Mutable: what has finished, arrived and been posted so far, and which
    rank waits on what (a work list, as ``engine.play``'s)."""

    def __init__(self, low: Lowered, sc: StageCosts, costs: Costs):
        sched = low.schedule
        self.low, self.sc = low, sc
        self.m, self.place = sched.microbatches, sched.placement
        self.first, self.last = sched.first_stages, sched.last_stages
        self.n_keys = sched.stages * self.m
        programs = self.programs = low.programs
        R = len(programs)
        self.out = Played(low)
        self.done = [-1.0] * (2 * self.n_keys)  # compute: F done, input gradient done
        self.arrive: dict = {}  # message key -> (arrival, sent at)
        self.got: list[dict] = [dict() for _ in range(R)]  # per rank: key -> (arrival, sent at, receive position)
        self.link_free: dict = {}
        self.stream_free: list[dict] = [dict() for _ in range(R)]
        self.gathered: list[dict] = [dict() for _ in range(R)]  # stage -> (end of its latest gather, position)
        self.entered: dict = {}  # cross-rank collective -> {rank: posted}
        self.seq: list[dict] = [dict() for _ in range(R)]  # group -> collectives of it entered so far
        self.last_op = [max((k for k, a in enumerate(p) if type(a) is not CommAction), default=-1) for p in programs]
        self.comm_end = [0.0] * R  # latest end of the collectives the rank posted
        self.op_start = [0.0] * R
        self.index_of = [{k: j for j, k in enumerate(k for k, a in enumerate(p) if type(a) is not CommAction)}
                         for p in programs]
        self.pos, self.clock = [0] * R, [0.0] * R
        self.waiting: dict = {}
        self.queue = deque(range(R))
        self.lat, self.bw = costs.latency, costs.bandwidth
        self.blocking = low.options.overlap.blocking_p2p

    def wait(self, key, r: int) -> bool:
        self.waiting.setdefault(key, []).append(r)
        return False

    def wake(self, key) -> None:
        if self.waiting:
            woken = self.waiting.pop(key, None)
            if woken:
                self.queue.extend(woken)

    def run(self) -> None:
        programs = self.programs
        while self.queue:
            r = self.queue.popleft()
            prog = programs[r]
            i, t = self.pos[r], self.clock[r]
            while i < len(prog):
                a = prog[i]
                if type(a) is CommAction:
                    if not self.comm(r, i, a, t):
                        break
                    if self.blocking and a.kind in SENDS:  # the sender waits for it to arrive
                        t = max(t, self.out.ends[r][i])
                else:
                    end = self.compute(r, i, a, t)
                    if end is None:
                        break
                    t = end
                i += 1
            self.pos[r], self.clock[r] = i, t
        if any(self.pos[r] < len(p) for r, p in enumerate(programs)):
            raise Stuck(_blocked(self.low, self.pos))

    def comm(self, r: int, i: int, a: CommAction, t: float) -> bool:
        """Post communication action ``a`` (position ``i`` of rank ``r``, whose compute is free at ``t``); False
        when it must wait for another rank first."""
        kind = a.kind
        post = t
        if a.during:
            post = self.op_start[r]
        elif i > self.last_op[r] and kind not in SENDS and kind not in RECVS:
            post = max(t, self.comm_end[r])  # after the rank's last op: once what it posted is done
        if kind in SENDS:
            self.send(r, i, a, post)
            return True
        if kind in RECVS:
            return self.recv(r, i, a)
        return self.collective(r, i, a, post, t)

    def send(self, r: int, i: int, a: CommAction, post: float) -> None:
        key = a.key
        if self.bw and a.nbytes > 0:
            occ, delay = a.nbytes / self.bw, self.lat
        else:  # no bytes: the cost model's message time of that boundary
            occ, delay = 0.0, self.sc.message[key[1] - 1 if key[0] == "F" else key[1]]
        start = max(post, self.link_free.get((r, a.peer), 0.0))
        self.link_free[(r, a.peer)] = start + occ
        self.arrive[key] = (start + occ + delay, post)
        self.out.starts[r][i], self.out.ends[r][i] = start, start + occ + delay
        self.wake(("msg", key))

    def recv(self, r: int, i: int, a: CommAction) -> bool:
        key = a.key
        got = self.arrive.get(key)
        if got is None:
            return self.wait(("msg", key), r)
        self.got[r][key] = (got[0], got[1], i)
        self.out.starts[r][i], self.out.ends[r][i] = got[1], got[0]
        self.wake(("recv", r, key))
        return True

    def collective(self, r: int, i: int, a: CommAction, post: float, t: float) -> bool:
        members = self.low.members(r, a)
        dur = self.low.duration(r, a)
        free = self.stream_free[r]
        if len(members) > 1:  # starts when every member has posted it
            j = self.seq[r].get(a.group, 0)
            inst = (a.group, members, j)
            posts = self.entered.setdefault(inst, {})
            if r not in posts:
                posts[r] = max(post, free.get(a.stream, 0.0))
                self.wake(("coll", inst))
            if len(posts) < len(members):
                return self.wait(("coll", inst), r)
            self.seq[r][a.group] = j + 1
            start = max(posts.values())
        else:
            start = max(post, free.get(a.stream, 0.0))
        end = start + dur
        if a.during:  # bucketed: done no earlier than its op, running in the op's last part
            end = max(end, t)
            start = end - dur
        if dur or a.during:
            free[a.stream] = end
        self.out.starts[r][i], self.out.ends[r][i] = start, end
        if a.kind == UNSHARD:
            self.gathered[r][a.stage] = (end, i)
        if a.kind != ALL_TO_ALL:
            self.comm_end[r] = max(self.comm_end[r], end)
        return True

    def compute(self, r: int, i: int, op, t: float) -> float | None:
        """Run compute op ``op`` at the earliest time it can: its end, or None when an input is not there yet."""
        acts = actions_of(op)
        base, comm, via = t, 0.0, -1
        for x in acts:
            got = self.inputs(r, x)
            if len(got) == 1:
                self.wait(got[0], r)
                return None
            b, c, v = got
            base = max(base, b)
            if c > comm:
                comm, via = c, v
            g = self.gathered[r].get(x.stage)
            if g is not None and g[0] > comm:
                comm, via = g
        start = max(base, comm)
        if via >= 0 and comm > base:  # it waited for a transfer beyond everything else it needed
            self.out.exposed[r][via] += comm - base
            self.out.waited[r][self.index_of[r][i]] = via
        self.op_start[r] = start
        end = start + op_time(op, self.sc)
        self.out.starts[r][i], self.out.ends[r][i] = start, end
        m, n_keys = self.m, self.n_keys
        for kind, s, mb in acts:
            if kind != "W":
                k = s * m + mb if kind == "F" else n_keys + s * m + mb
                self.done[k] = end
                self.wake(k)
        return end

    def inputs(self, r: int, a) -> tuple:
        """(ready from compute, ready with transfers, position of the transfer that came last), or a 1-tuple of
        the key it waits on (a compute result, or ("recv", rank, message) for a receive not posted yet)."""
        kind, s, mb = a
        m, n_keys, first, last = self.m, self.n_keys, self.first, self.last
        if kind == "F":
            deps = (((s - 1) * m + mb, ("F", s, mb), s - 1),) if s != first[s] else ()
        elif kind == "W":
            deps = ((n_keys + s * m + mb, None, s),)
        else:
            deps = ((s * m + mb, None, s),) + (
                ((n_keys + (s + 1) * m + mb, ("B", s, mb), s + 1),) if s != last[s] else ())
        base = comm = 0.0
        via = -1
        for k, msg_key, src in deps:
            if msg_key is None or self.place[src] == r:
                d = self.done[k]
                if d < 0:
                    return (k,)
                base = max(base, d)
            else:
                g = self.got[r].get(msg_key)
                if g is None:
                    return (("recv", r, msg_key),)
                arrival, sent, where = g
                base = max(base, sent)
                if arrival > comm:
                    comm, via = arrival, where
        return base, comm, via

    def tail(self) -> None:
        """The step ends when every rank's compute and transfers are done: what runs past the last op is exposed."""
        programs, starts, ends, exposed = self.programs, self.out.starts, self.out.ends, self.out.exposed
        finish = max((ends[r][k] for r, p in enumerate(programs) for k in range(len(p))
                      if type(p[k]) is not CommAction), default=0.0)
        for r, prog in enumerate(programs):
            edge = finish
            late = [k for k, a in enumerate(prog) if type(a) is CommAction and a.kind not in SENDS
                    and a.kind not in RECVS and ends[r][k] > edge]
            for k in sorted(late, key=lambda k: ends[r][k]):
                # at most its own length: waiting for the other members of a collective is their lateness
                exposed[r][k] += min(ends[r][k] - edge, ends[r][k] - starts[r][k])
                edge = ends[r][k]


def _blocked(low: Lowered, pos: list[int]) -> list[Blocked]:
    from ..actions import Action

    out = []
    for r, prog in enumerate(low.programs):
        if pos[r] < len(prog):
            a = prog[pos[r]]
            out.append(Blocked(r, pos[r], a, Action(str(a), -1, -1)))  # what it waits on: check.describe_stuck
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


__all__ = ["simulate_lowered", "Played", "a2a_costs", "compute_times", "lanes", "op_time", "play_lowered"]
