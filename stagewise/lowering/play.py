"""Play a lowered schedule: compute on each rank's compute stream, communication on its own resources.

- A send is posted when its op ends and occupies its link (one per sender and receiver, FIFO) for its
  bytes over the cost model's bandwidth; it arrives a latency later (no bytes given: the cost model's
  message time, today's link). Its receive is where the receiver's op takes it: the op starts no earlier.
  With ``Overlap.blocking_p2p`` (DeepSpeed) the sender's next op waits for the arrival too.
- A collective runs on its stream (one per rank and group: collectives over one group run in turn), from
  when it is posted (the rank reaches it) and the stream is free, for the network's time
  (``Lowered.duration``). One over several pipeline ranks (tie, step end) starts when every member has
  posted it. An op of a stage waits for the stage's latest gather; a reduction ``during`` its op (``True``) is
  posted when that op starts and ends no earlier than it; a bucket (``during`` a fraction f: a layer's
  gradients as the backward produces them, a layer's weights gathered one ahead of the compute) is posted
  once f of its op has run, and the stage's next op waits for its gathers. What comes after a rank's last op waits for everything
  the rank posted before it (the optimizer needs the reduced gradients).
- An expert all-to-all is inside its op (the cost model's ``a2a``, ``overlap``): drawn where the op pays it.

Each op starts at max(its rank free, its inputs, its gathers), so, as in ``engine.play``, times do not depend
on the order ranks are advanced in and a work list with wake-ups is exact. With every transfer free the
compute times are ``engine.play``'s exactly. Exposed time of a transfer: what an op (or the step's end)
waited for it beyond everything else it needed; the rest of it was hidden behind compute.
"""

from __future__ import annotations

from collections import deque
from itertools import compress
from operator import itemgetter

from ..actions import Pair, new
from ..costs import Costs, StageCosts
from ..engine import Blocked, Stuck
from ..overlap import Comm, comm_lanes, pair_parts, pair_time
from ..collector import gc_paused
from .comms import ALL_TO_ALL, RECV_B, RECVS, SEND_B, SENDS, UNSHARD, CommAction
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
    rank waits on what (a work list, as ``engine.play``'s).

    What the loop looks up is an integer index into a flat list: a compute result's key as ``engine.play``'s
    (F done at [0, n_keys), input gradient done at [n_keys, 2 n_keys)); a message's id the key of the action
    that takes it (F at [0, n_keys), B after; past 2 n_keys for a key out of the schedule's range, in a
    hand-made program); a stream's id per rank and stream. Entries are decoded where they are played (each
    is played once: a table of them would cost more than it saves); a collective's duration, stream and
    members are cached per rank under what decides them. A rank parked on a key waits in ``waiter``
    (compute keys, then message ids; a second rank on one key in ``extra``), on a cross-rank collective
    in ``coll_wait``."""

    def __init__(self, low: Lowered, sc: StageCosts, costs: Costs):
        sched = low.schedule
        self.low, self.sc = low, sc
        programs = self.programs = low.programs
        R, S, m = len(programs), sched.stages, sched.microbatches
        self.S, self.m, self.n_keys = S, m, S * m
        place, first, last = sched.placement, sched.first_stages, sched.last_stages
        # per stage, the rank its input comes from (-1: none, the lane's first stage) and its gradient
        self.f_from = [place[s - 1] if s != first[s] else -1 for s in range(S)]
        self.g_from = [place[s + 1] if s != last[s] else -1 for s in range(S)]
        self.dur = {k: [sc.duration(k, s) for s in range(S)] for k in "FBIW"}  # a plain op's (``op_time``)
        # messages not lowered (``LoweringOptions.p2p`` False): the link time into each stage, engine.play's
        self.links_in = None if low.options.p2p else _links_in(sched, sc)
        self.pair_dur: dict = {}  # (forward stage, backward kind, backward stage) -> a pair's
        self.lat, self.bw = costs.latency, costs.bandwidth
        self.blocking = low.options.overlap.blocking_p2p
        self.out = Played(low)
        self.done = [-1.0] * (2 * self.n_keys)
        self.arrive_at = [-1.0] * (2 * self.n_keys)  # per message: its arrival
        self.arrive_sent = [-1.0] * (2 * self.n_keys)  # and when it was posted (its op's end)
        self.odd: dict = {}  # message key out of range (a hand-made program) -> its id
        self.got = [dict() for _ in range(R)]  # per rank: message id -> (arrival, sent at, receive position)
        self.links: list[dict] = [dict() for _ in range(R)]  # per sender: receiver -> its link free at
        self.streams: dict = {}  # (rank, stream) -> id into stream_free
        self.stream_free: list[float] = []
        self.colls: list[dict] = [dict() for _ in range(R)]  # per rank: what a collective's play needs, cached
        self.gathered_end = [[-1.0] * S for _ in range(R)]  # per rank and stage: the latest gather's end
        self.gathered_pos = [[-1] * S for _ in range(R)]  # and its position
        self.gathers = [False] * R  # whether the rank gathered anything yet
        self.entered: dict = {}  # cross-rank collective instance -> {rank: posted}
        self.seq: list[dict] = [dict() for _ in range(R)]  # group -> collectives of it entered so far
        self.comm_end = [0.0] * R  # latest end of the collectives the rank posted
        self.op_start = [0.0] * R
        self.played_colls: list[list[int]] = [[] for _ in range(R)]  # positions of the collectives played
        self.last_op = [_last_op(p) for p in programs]
        self.ops_done = [0] * R  # how many of the rank's ops have run (``Played.waited``'s key of the next)
        self.pos, self.clock = [0] * R, [0.0] * R
        self.waiter = [-1] * (4 * self.n_keys)  # compute keys, then message ids
        self.extra: dict[int, list[int]] = {}
        self.coll_wait: dict = {}
        self.queue = deque(range(R))

    def run(self) -> None:
        """Advance ranks from the work list until none can go on; raises ``Stuck`` if some did not finish."""
        queue, advance = self.queue, self.advance
        while queue:
            advance(queue.popleft())
        if any(self.pos[r] < len(p) for r, p in enumerate(self.programs)):
            raise Stuck(_blocked(self.low, self.pos))

    def advance(self, r: int) -> None:
        """Run rank ``r`` from where it stopped until it waits or is through; compute, sends, receives and
        collectives written out (the lowered play's hot path)."""
        queue, done, waiter, extra, out = self.queue, self.done, self.waiter, self.extra, self.out
        arrive_at, arrive_sent = self.arrive_at, self.arrive_sent
        f_from, g_from, dur, message = self.f_from, self.g_from, self.dur, self.sc.message
        fwd_link, bwd_link = self.links_in or (None, None)
        S, m, n_keys, n2 = self.S, self.m, self.n_keys, 2 * self.n_keys
        bw, lat, blocking = self.bw, self.lat, self.blocking
        Comm_, Pair_, SENDS_, RECVS_, SEND_B_, RECV_B_ = CommAction, Pair, SENDS, RECVS, SEND_B, RECV_B  # locals
        stages, mbs = range(S), range(m)  # a message key in both: its id is arithmetic
        prog, st, en, ex = self.programs[r], out.starts[r], out.ends[r], out.exposed[r]
        links, g_end, g_pos = self.links[r], self.gathered_end[r], self.gathered_pos[r]
        i, t, op_start, comm_end = self.pos[r], self.clock[r], self.op_start[r], self.comm_end[r]
        gathers, gotr, j = self.gathers[r], self.got[r], self.ops_done[r]
        n, kw = len(prog), -1  # kw: the key it parks on (-1: none it can be woken by, or parked already)
        for i in range(i, n):
            a = prog[i]
            ta = type(a)
            if ta is not Comm_:  # a compute op: ``ready`` and ``pair`` written out (the loop's hot path)
                if ta is Pair_:  # an F&B pair (DualPipe's)
                    start, end = self.pair(r, i, j, a, t, gotr, gathers)
                    if start is None:
                        kw = end
                        break
                    op_start, t = start, end
                    j += 1
                    continue
                kind, s, mb = a
                k = s * m + mb  # its F's key, its F input's message id
                base, comm, via = t, 0.0, -1
                if kind == "F":
                    dk, src = k, f_from[s]
                    if src == r or (src >= 0 and fwd_link is not None):  # here, or a message as its link time
                        x = done[k - m]
                        if x < 0:
                            kw = k - m
                            break
                        if fwd_link is not None:  # (0 on one rank)
                            x += fwd_link[s]
                        if x > base:
                            base = x
                    elif src >= 0:
                        g = gotr.get(k)
                        if g is None:  # its receive is not before it: never posted
                            break
                        x, y, where = g
                        if y > base:
                            base = y
                        if x > comm:
                            comm, via = x, where
                elif kind == "W":
                    dk = -1
                    x = done[n_keys + k]
                    if x < 0:
                        kw = n_keys + k
                        break
                    if x > base:
                        base = x
                else:
                    dk, src = n_keys + k, g_from[s]
                    x = done[k]
                    if x < 0:
                        kw = k
                        break
                    if x > base:
                        base = x
                    if src == r or (src >= 0 and bwd_link is not None):
                        x = done[dk + m]
                        if x < 0:
                            kw = dk + m
                            break
                        if bwd_link is not None:
                            x += bwd_link[s]
                        if x > base:
                            base = x
                    elif src >= 0:
                        g = gotr.get(dk)
                        if g is None:
                            break
                        x, y, where = g
                        if y > base:
                            base = y
                        if x > comm:
                            comm, via = x, where
                if gathers and g_end[s] > comm:
                    comm, via = g_end[s], g_pos[s]
                if comm > base:  # it waited for a transfer beyond everything else it needed (comm > 0: via set)
                    start = comm
                    ex[via] += comm - base
                    out.waited[r][j] = via
                else:
                    start = base
                op_start = start
                t = start + dur[kind][s]
                st[i] = start
                en[i] = t
                j += 1
                if dk >= 0:
                    done[dk] = t
                    w = waiter[dk]
                    if w >= 0:
                        waiter[dk] = -1
                        queue.append(w)
                        if extra:
                            queue.extend(extra.pop(dk, ()))
                continue
            kind, s, mb, peer, _, nbytes, _, _, during = a
            if kind in SENDS_:  # on its link from when it is posted and the link is free
                back = kind == SEND_B_
                s2 = s - 1 if back else s + 1  # the stage it goes into
                if bw and nbytes > 0:
                    occ, delay = nbytes / bw, lat
                else:  # no bytes: the cost model's message time of that boundary
                    occ, delay = 0.0, message[s2 if back else s]  # (the boundary between s and s2)
                post = op_start if during else t
                x = links.get(peer, 0.0)
                start = x if x > post else post
                x = start + occ
                links[peer] = x
                x += delay
                st[i] = start
                en[i] = x
                if blocking and x > t:  # the sender waits for it to arrive
                    t = x
                if mb in mbs and s2 in stages:
                    mid = n_keys + s2 * m + mb if back else s2 * m + mb
                else:
                    mid = self.odd_id(back, s2, mb)
                arrive_at[mid], arrive_sent[mid] = x, post
                k = n2 + mid
                w = waiter[k]
                if w >= 0:
                    waiter[k] = -1
                    queue.append(w)
                    if extra:
                        queue.extend(extra.pop(k, ()))
            elif kind in RECVS_:
                if mb in mbs and s in stages:
                    mid = n_keys + s * m + mb if kind == RECV_B_ else s * m + mb
                else:
                    mid = self.odd_id(kind == RECV_B_, s, mb)
                x = arrive_at[mid]
                if x < 0:
                    kw = n2 + mid
                    break
                y = arrive_sent[mid]
                gotr[mid] = (x, y, i)
                st[i] = y
                en[i] = x
            else:  # a collective: ``post``
                c = self.post(r, i, a, t, op_start, comm_end)
                if c < 0:
                    break
                comm_end = c
                gathers = gathers or kind == UNSHARD
        else:  # through its program
            i = n
        if i < n and kw >= 0:  # parked until key ``kw`` is done or arrives
            if waiter[kw] < 0:
                waiter[kw] = r
            else:
                extra.setdefault(kw, []).append(r)
        self.pos[r], self.clock[r], self.op_start[r], self.comm_end[r] = i, t, op_start, comm_end
        self.gathers[r], self.ops_done[r] = gathers, j

    def post(self, r: int, i: int, a: CommAction, t: float, op_start: float, comm_end: float) -> float:
        """Play collective ``a`` at position ``i`` of rank ``r`` (free at ``t``, its last op started at
        ``op_start``, what it posted done at ``comm_end``): on its stream from when it is posted and the
        stream is free. The rank's new ``comm_end``, or -1 when it waits for the other members."""
        kind, s, _, peer, group, nbytes, stream, op, during = a
        key = (kind, group, op, nbytes, peer, stream)
        d, sid, cross = self.colls[r].get(key) or self.collective(r, a, key)
        if during is True:  # a whole reduction over its op: posted when the op starts
            post = op_start
        elif during is not False:  # a bucket: once its share of the op has run
            post = op_start + during * (t - op_start)
        elif i > self.last_op[r] and comm_end > t:  # after the rank's last op: once all it posted is done
            post = comm_end
        else:
            post = t
        x = self.stream_free[sid]
        start = x if x > post else post
        if cross is not None:  # over several pipeline ranks: when every member has posted it
            start = self.enter(r, cross, start)
            if start is None:
                return -1.0
        end = start + d
        if during is True:  # done no earlier than its op, running in the op's last part
            if t > end:
                end = t
            start = end - d
        if d or during:
            self.stream_free[sid] = end
        self.out.starts[r][i], self.out.ends[r][i] = start, end
        if kind == UNSHARD and 0 <= s < self.S:  # (no op reads another stage's)
            self.gathered_end[r][s], self.gathered_pos[r][s] = end, i
        self.played_colls[r].append(i)
        return end if kind != ALL_TO_ALL and end > comm_end else comm_end

    def collective(self, r: int, a: CommAction, key: tuple) -> tuple:
        """(duration, stream id, (group, members) when over several pipeline ranks else None) of collective
        ``a`` of rank ``r``, kept under ``key`` (what ``Lowered.duration`` and ``members`` read of it)."""
        members = self.low.members(r, a)
        sid = self.streams.get((r, a.stream))
        if sid is None:
            sid = self.streams[(r, a.stream)] = len(self.stream_free)
            self.stream_free.append(0.0)
        c = self.colls[r][key] = (self.low.duration(r, a), sid, (a.group, members) if len(members) > 1 else None)
        return c

    def enter(self, r: int, cross: tuple, posted: float) -> float | None:
        """Rank ``r`` posts its next collective over ``cross`` (group, members), free to start at ``posted``:
        its start once every member has posted it, else None (``r`` waits for them)."""
        group, members = cross
        j = self.seq[r].get(group, 0)
        inst = (group, members, j)
        posts = self.entered.setdefault(inst, {})
        if r not in posts:
            posts[r] = posted
            woken = self.coll_wait.pop(inst, None)
            if woken:
                self.queue.extend(woken)
        if len(posts) < len(members):
            self.coll_wait.setdefault(inst, []).append(r)
            return None
        self.seq[r][group] = j + 1
        return max(posts.values())

    def odd_id(self, back: bool, s, mb) -> int:
        """The id of a message whose key is out of the schedule's range, given on first sight."""
        key = (back, s, mb)
        mid = self.odd.get(key)
        if mid is None:
            mid = self.odd[key] = len(self.arrive_at)
            self.arrive_at.append(-1.0)
            self.arrive_sent.append(-1.0)
            self.waiter.append(-1)  # at 2 n_keys + mid: ids and waiters grow together
        return mid

    def pair_time(self, op: Pair) -> float:
        fa, ba = op
        key = (fa.stage, ba.kind, ba.stage)
        d = self.pair_dur.get(key)
        if d is None:
            d = self.pair_dur[key] = op_time(op, self.sc)
        return d

    def pair(self, r: int, i: int, j: int, op: Pair, t: float, gotr: dict, gathers: bool) -> tuple:
        """Play F&B pair ``op``, rank ``r``'s op ``j`` at position ``i`` (free at ``t``): (start, end), or
        (None, the key it waits on; -1: none it can be woken by)."""
        base, comm, via = t, 0.0, -1
        g_end, g_pos = self.gathered_end[r], self.gathered_pos[r]
        for x in op:
            got = self.ready(r, x, gotr)
            if len(got) == 1:
                return None, got[0]
            b, c, v = got
            if b > base:
                base = b
            if c > comm:
                comm, via = c, v
            if gathers and g_end[x.stage] > comm:
                comm, via = g_end[x.stage], g_pos[x.stage]
        start = comm if comm > base else base
        if via >= 0 and comm > base:  # it waited for a transfer beyond everything else it needed
            self.out.exposed[r][via] += comm - base
            self.out.waited[r][j] = via
        end = start + self.pair_time(op)
        self.out.starts[r][i], self.out.ends[r][i] = start, end
        m, n_keys = self.m, self.n_keys
        for kind, s, mb in op:
            if kind != "W":
                self.finish(s * m + mb if kind == "F" else n_keys + s * m + mb, end)
        return start, end

    def ready(self, r: int, a, gotr: dict) -> tuple:
        """(ready from compute, ready with transfers, position of the transfer that came last) of plain action
        ``a`` on rank ``r``, or a 1-tuple of the key it waits on (-1: a receive not before it, never posted)."""
        kind, s, mb = a
        m, n_keys, done = self.m, self.n_keys, self.done
        k = s * m + mb
        if kind == "F":
            src = self.f_from[s]
            deps = ((k - m, k),) if src >= 0 else ()
        elif kind == "W":
            deps, src = ((n_keys + k, -1),), r
        else:
            src = self.g_from[s]
            deps = ((k, -1),) + (((n_keys + k + m, n_keys + k),) if src >= 0 else ())
        base = comm = 0.0
        via = -1
        links = self.links_in
        for key, mid in deps:
            if mid < 0 or src == r or links is not None:  # computed here, or a message not lowered
                d = done[key]
                if d < 0:
                    return (key,)
                if mid >= 0 and src != r and links is not None:
                    d += links[0][s] if kind == "F" else links[1][s]
                if d > base:
                    base = d
            else:
                g = gotr.get(mid)
                if g is None:
                    return (-1,)
                arrival, sent, where = g
                if sent > base:
                    base = sent
                if arrival > comm:
                    comm, via = arrival, where
        return base, comm, via

    def finish(self, k: int, t: float) -> None:
        """Compute key ``k`` done at ``t``: wake the ranks waiting on it."""
        self.done[k] = t
        w = self.waiter[k]
        if w >= 0:
            self.waiter[k] = -1
            self.queue.append(w)
            if self.extra:
                self.queue.extend(self.extra.pop(k, ()))

    def tail(self) -> None:
        """The step ends when every rank's compute and transfers are done: what runs past the last op is exposed."""
        # a rank's last op ends last: each starts once the one before it has ended, and lasts >= 0
        finish = max((en[k] for en, k in zip(self.out.ends, self.last_op) if k >= 0), default=0.0)
        for st, en, ex, colls in zip(self.out.starts, self.out.ends, self.out.exposed, self.played_colls):
            edge = finish
            late = [k for k in colls if en[k] > edge]
            for k in sorted(late, key=en.__getitem__):
                # at most its own length: waiting for the other members of a collective is their lateness
                ex[k] += min(en[k] - edge, en[k] - st[k])
                edge = en[k]


def _links_in(sched, sc: StageCosts) -> tuple[list[float], list[float]]:
    """The link time into each stage from its predecessor (forward) and its successor (gradient), 0 on one
    rank: ``engine.play``'s, for messages that are not lowered."""
    from ..engine import routes

    return routes(sched, sc)[2:]


def _last_op(prog) -> int:
    """Position of a program's last compute op (-1: none)."""
    for k in range(len(prog) - 1, -1, -1):
        if type(prog[k]) is not CommAction:
            return k
    return -1


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
        st, en, ex = played.starts[r], played.ends[r], played.exposed[r]
        comms = [(k, a) for k, a in enumerate(prog) if type(a) is CommAction]
        # the j-th transfer at position k comes after k - j compute ops: it belongs to the last of them
        lane += [new(Comm, (k - j - 1 if k > j else 0, a, st[k], en[k], ex[k], a.kind))
                 for j, (k, a) in enumerate(comms) if a.kind != ALL_TO_ALL and (en[k] > st[k] or ex[k] > 0)]
        anything = anything or bool(lane)
        out.append(tuple(sorted(lane, key=_start_end)))
    return tuple(out) if anything else None


_start_end = itemgetter(2, 3)  #: a ``Comm``'s (start, end)


def compute_times(low: Lowered, played: Played):
    """The compute ops' (starts, ends) per rank, aligned with the schedule's programs."""
    starts, ends = [], []
    for r, prog in enumerate(low.programs):
        ops = [type(a) is not CommAction for a in prog]
        starts.append(list(compress(played.starts[r], ops)))
        ends.append(list(compress(played.ends[r], ops)))
    return starts, ends


def step_span(low: Lowered, costs: Costs) -> tuple[float, dict[str, float]]:
    """(the step's span, transfers included, and per kind of transfer the most seconds one rank waited on it)
    of a valid lowered schedule: ``simulate_lowered``'s ``finish - origin`` and ``Metrics.comm``'s worst
    exposed time without building the timeline (the planner asks it of every configuration it lowers)."""
    costs = a2a_costs(low, costs)
    played = play_lowered(low, costs.resolve(low.schedule.stages), costs)
    origin = min(min(st) for st in played.starts if st)
    finish = max(max(en) for en in played.ends if en)
    worst: dict[str, float] = {}
    for prog, ex in zip(low.programs, played.exposed):
        mine: dict[str, float] = {}
        for a, x in zip(prog, ex):
            if x:
                mine[a.kind] = mine.get(a.kind, 0.0) + x
        for kind, x in mine.items():
            worst[kind] = max(worst.get(kind, 0.0), x)
    return finish - origin, worst


def simulate_lowered(low: Lowered, costs: Costs | None = None, *, check: bool = True):
    """The ``Timeline`` of a lowered schedule under ``costs``: the compute ops' times (``engine.play``'s when
    every transfer is free), ``comm`` every transfer with a duration, ``meta["lowered"]`` the lowering and
    ``meta["played"]`` the times of all its actions. Raises ``ScheduleError`` for an invalid schedule or a
    deadlock."""
    from ..timeline import Timeline
    from ..validate import ScheduleError, check_structure
    from .stuck import describe_stuck

    costs = a2a_costs(low, costs or Costs())
    sched = low.schedule
    sc = costs.resolve(sched.stages)
    if check:
        check_structure(sched)
    try:
        played = play_lowered(low, sc, costs)
    except Stuck as stuck:
        raise ScheduleError(describe_stuck(low, stuck)) from None
    with gc_paused():  # a tuple per transfer and no cycles
        starts, ends = compute_times(low, played)
        comm = lanes(low, played, sc, starts, ends)
    return Timeline(
        schedule=sched, starts=tuple(map(tuple, starts)), ends=tuple(map(tuple, ends)),
        activation=tuple(sc.activation), activation_bytes=tuple(sc.activation_bytes) if sc.activation_bytes else None,
        free_at_i=sc.free_at_i, cap=tuple(costs.cap.per_rank(sched.ranks)) if costs.cap is not None else None,
        cap_unit=costs.cap.unit if costs.cap is not None else "chunks",
        comm=comm, meta={"costs": costs, "lowered": low, "played": played})


__all__ = ["simulate_lowered", "step_span", "Played", "a2a_costs", "compute_times", "lanes", "op_time", "play_lowered"]
