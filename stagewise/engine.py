"""The play engine: runs every rank's program in order, compute and communication, against a cost model.

One engine plays both a schedule's compute programs (``play``) and a lowered schedule's programs, compute
ops with their transfers and collectives (``lowering.play``); a compute-only schedule is a lowered program
without communication whose messages take their link's time.

- An op starts when its rank is free and its inputs have arrived (``F(s)`` after ``F(s-1)``, ``B|I(s)`` after
  ``F(s)`` and the gradient of ``s+1``, ``W(s)`` after ``I(s)``). With sequence slices (``Schedule.slices``) a
  slice's forward also waits for the previous slice's forward on its stage (the keys and values it attends to)
  and a slice's backward for the next slice's (their gradients handed back): on the same rank, so program
  order gives it, and a program that breaks it is ``Stuck``. A message not lowered adds
  the link's time (``costs.message``) to the receiver's ready time and never occupies the sender. An op's
  duration depends on the op alone (compute, its all-to-all, and for an F&B pair what of that is hidden:
  ``overlap``), never on when it runs. Micro-batches may differ (``Costs.mb_time``, ``mb_activation``): an op
  of micro-batch u takes its factor on its duration, its messages' bytes and its all-to-all; an F&B pair's
  halves belong to two micro-batches, each half scaled by its own.
- A send is posted when its op ends and occupies its link (one per sender and receiver, FIFO) for its
  bytes over the cost model's bandwidth; it arrives a latency later (no bytes given: the cost model's
  message time, today's link). Its receive is where the receiver's op takes it: the op starts no earlier.
  With ``Overlap.blocking_p2p`` (DeepSpeed) the sender's next op waits for the arrival too.
- A message's header (``SEND_F_HDR`` ...) is a small message on the same link, right before its data: its
  bytes over the bandwidth, and the latency. Its receive holds the receiver until it has arrived (the
  receiver needs the shapes to post the data's receive), so a header taken out of the data's order is a
  wait that the play finds (``Stuck``).
- A collective runs on its stream (one per rank and group: collectives over one group run in turn), from
  when it is posted (the rank reaches it) and the stream is free, for the network's time
  (``Lowered.duration``). One over several pipeline ranks (tie, step end) starts when every member has
  posted it. An op of a stage waits for the stage's latest gather; a reduction ``during`` its op (``True``) is
  posted when that op starts and ends no earlier than it; a bucket (``during`` a fraction f: a layer's
  gradients as the backward produces them, a layer's weights gathered one ahead of the compute) is posted
  once f of its op has run, and the stage's next op waits for its gathers. What comes after a rank's last op
  waits for everything the rank posted before it (the optimizer needs the reduced gradients).
- An expert all-to-all is inside its op (the cost model's ``a2a``, ``overlap``): drawn where the op pays it.
- Memory actions (``actions.MEMORY_KINDS``): an ``OFFLOAD`` or ``RELOAD`` runs on its rank's host stream (FIFO,
  in program order) from when the rank reaches it (an OFFLOAD no earlier than its F's end, a RELOAD than its
  OFFLOAD's) for ``StageCosts.host``; the rank does not wait for it. A ``RECOMPUTE`` runs on the compute stream
  for its stage's forward (``StageCosts.duration``). The unit's backward (B or I, alone or in a pair) starts no
  earlier than its RELOAD or RECOMPUTE ends; a wait for a reload beyond everything else is its exposed time.
  Each waits only on ops of its own rank before it (``validate`` checks the order), so none parks.

Each op starts at max(its rank free, its inputs, its gathers), so start times do not depend on the order in
which ranks are advanced: a work list with wake-ups (no event heap) gives the exact timeline in time linear
in the number of actions. Exposed time of a transfer: what an op (or the step's end) waited for it beyond
everything else it needed; the rest of it was hidden behind compute.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .actions import HOST_KINDS, MEMORY_KINDS, OFFLOAD, RELOAD, Action, Pair
from .costs import CostError, StageCosts, per_microbatch
from .all_to_all import pair_parts, pair_time


@dataclass(frozen=True)
class Blocked:
    """A rank that cannot go on: the op at ``position`` waits for ``waits_for`` (a compute input, or for a
    transfer ``Action(str(op), -1, -1)``: ``lowering.check.describe_stuck`` reads the program)."""

    rank: int
    position: int
    op: object
    waits_for: Action


class Stuck(Exception):
    """Some ranks never finish: a wait cycle (deadlock)."""

    def __init__(self, blocked: list[Blocked]):
        super().__init__("deadlock")
        self.blocked = blocked


def play(schedule, costs: StageCosts) -> tuple[list[list[float]], list[list[float]]]:
    """Start and end time of every op of a compute-only schedule, per rank, aligned with the programs.

    Raises ``Stuck`` when some rank can never proceed. Assumes the structural checks of
    ``validate.check_structure`` passed.
    """
    out = Engine(schedule, costs).play()
    return out.starts, out.ends


class Played:
    """The times of a play: per rank, aligned with its programs, (start, end) of every entry and the exposed
    seconds of each communication action. Mutable while playing only."""

    def __init__(self, programs):
        self.starts = [[0.0] * len(p) for p in programs]
        self.ends = [[0.0] * len(p) for p in programs]
        self.exposed = [[0.0] * len(p) for p in programs]
        #: per rank, a compute op's position -> the position of the transfer it waited for last (what held it
        #: beyond its rank being free and its inputs computed)
        self.waited: list[dict[int, int]] = [dict() for _ in programs]


def op_time(op, sc: StageCosts) -> float:
    """An op's duration: a plain action's compute and all-to-all; an F&B pair's set by hand (``fb``) or
    derived (``overlap.pair_time``)."""
    if type(op) is Pair:
        fa, ba = op
        if sc.fb is not None:
            d = sc.fb[fa.stage]
            if sc.mb_time is None:
                return d
            # set by hand for a pair of like micro-batches: each half's compute share takes its own factor
            cf, cb = sc.f[fa.stage], sc.compute(ba.kind, ba.stage)
            return d * (cf * sc.mb_time[fa.mb] + cb * sc.mb_time[ba.mb]) / (cf + cb) if cf + cb > 0 else d
        if sc.a2a_f is not None:
            return pair_time(*pair_parts(op, sc))
        return sc.compute("F", fa.stage, fa.mb) + sc.compute(ba.kind, ba.stage, ba.mb)
    return sc.duration(op.kind, op.stage, op.mb)


def routes(schedule, costs: StageCosts):
    """First and last stage of each stage's lane, and the link time into each stage
    from its predecessor (forward) and from its successor (gradient); 0 on one rank."""
    S, placement, msg = schedule.stages, schedule.placement, costs.message
    first, last = schedule.first_stages, schedule.last_stages
    fwd_link = [msg[s - 1] if s > first[s] and placement[s - 1] != placement[s] else 0.0 for s in range(S)]
    bwd_link = [msg[s] if s < last[s] and placement[s + 1] != placement[s] else 0.0 for s in range(S)]
    return first, last, fwd_link, bwd_link


_NONE, _MESSAGE = -1.0, -2.0  #: an input's link time: none (a lane's end), or a lowered message (a receive)


class Engine:
    """One play. Mutable: what has finished, arrived and been posted so far, and which rank waits on what.

    ``low`` (a ``lowering.Lowered``, duck-typed: the core does not import the lowering to play compute
    only) gives the programs, whether messages are lowered (``options.p2p``) and the collectives' members
    and durations; ``latency`` and ``bandwidth`` time its sends. Without it the schedule's own programs are
    played, every message a link time.

    What the loop looks up is an integer index into a flat list: a compute result's key (F done at
    [0, n_keys), input gradient done at [n_keys, 2 n_keys)); a message's id the key of the action that takes
    it (F at [0, n_keys), B after; past 2 n_keys for a key out of the schedule's range, in a hand-made
    program); a stream's id per rank and stream. Entries are decoded where they are played (each is played
    once: a table of them would cost more than it saves); a collective's duration, stream and members are
    cached per rank under what decides them. A rank parked on a key waits in ``waiter`` (compute keys, then
    message ids; a second rank on one key in ``extra``), on a cross-rank collective in ``coll_wait``."""

    def __init__(self, schedule, sc: StageCosts, low=None, latency: float = 0.0, bandwidth: float | None = None):
        self.low, self.sc = low, sc
        programs = self.programs = low.programs if low is not None else schedule.programs
        R, S, m = len(programs), schedule.stages, schedule.microbatches
        self.S, self.m, self.n_keys = S, m, S * m
        self.slices = schedule.slices
        place, first, last, fwd, bwd = schedule.placement, *routes(schedule, sc)
        lowered_p2p = low is not None and low.options.p2p
        # per stage, its input's link time: a computed key's (0 on one rank), or none, or a lowered message
        self.f_lat = [_NONE if s == first[s] else _MESSAGE if lowered_p2p and place[s - 1] != place[s]
                      else fwd[s] for s in range(S)]
        self.g_lat = [_NONE if s == last[s] else _MESSAGE if lowered_p2p and place[s + 1] != place[s]
                      else bwd[s] for s in range(S)]
        self.dur = {k: [sc.duration(k, s) for s in range(S)] for k in "FBIW"}  # a plain op's (``op_time``)
        self.pair_dur: dict = {}  # (forward stage, backward kind, backward stage) -> a pair's
        self.lat, self.bw = latency, bandwidth
        self.blocking = low is not None and low.options.overlap.blocking_p2p
        self.kinds = _comm_kinds() if low is not None else (None, (), (), None, None, None, None, ())
        self.out = Played(programs)
        for name in ("mb_time", "mb_activation"):  # resolved without the schedule's count (a planner's): its check
            per_microbatch(name, getattr(sc, name), m)
        #: per micro-batch factors (None: all micro-batches alike, the tables above hold every duration)
        self.varied = sc.mb_time is not None or sc.mb_activation is not None
        self.mem: list | None = None  #: per key, when its backward's activations are back (made on first use)
        self.done = [-1.0] * (2 * self.n_keys)
        self.arrive_at = [-1.0] * (2 * self.n_keys)  # per message: its arrival
        self.arrive_sent = [-1.0] * (2 * self.n_keys)  # and when it was posted (its op's end)
        self.odd: dict = {}  # message key out of range (a hand-made program) -> its id
        self.streams: dict = {}  # (rank, stream) -> id into stream_free
        self.stream_free: list[float] = []
        self.colls: list[dict] = [dict() for _ in range(R)]  # per rank: what a collective's play needs, cached
        self.gathered_end = [[-1.0] * S for _ in range(R)]  # per rank and stage: the latest gather's end
        self.gathered_pos = [[-1] * S for _ in range(R)]  # and its position
        self.entered: dict = {}  # cross-rank collective instance -> {rank: posted}
        self.seq: list[dict] = [dict() for _ in range(R)]  # group -> collectives of it entered so far
        self.played_colls: list[list[int]] = [[] for _ in range(R)]  # positions of the collectives played
        self.last_op = [_last_op(p, self.kinds[0]) for p in programs] if low is not None else None
        #: per rank, where it stands: (position, free at, its last op's start, the latest end of the collectives
        #: it posted, whether it gathered anything yet)
        self.state = [(0, 0.0, 0.0, 0.0, False)] * R
        self.parked = [-1] * R  # the key each rank waits on (-1: none, or a collective's other members)
        self.waiter = [-1] * (4 * self.n_keys)  # compute keys, then message ids
        self.extra: dict[int, list[int]] = {}
        self.coll_wait: dict = {}
        self.queue = deque(range(R))

    def play(self) -> Played:
        """Advance ranks from the work list until none can go on (a rank runs from where it stopped until it
        waits or is through; compute, sends, receives and collectives written out: the engine's hot path).
        Raises ``Stuck`` if some rank did not finish."""
        queue, done, waiter, extra, out = self.queue, self.done, self.waiter, self.extra, self.out
        arrive_at, arrive_sent = self.arrive_at, self.arrive_sent
        f_lat, g_lat, dur, message = self.f_lat, self.g_lat, self.dur, self.sc.message
        S, m, n_keys, n2 = self.S, self.m, self.n_keys, 2 * self.n_keys
        bw, lat, blocking = self.bw, self.lat, self.blocking
        Comm_, SENDS_, RECVS_, SEND_B_, RECV_B_, UNSHARD_, _, HEADERS_ = self.kinds
        varied, sc, ma = self.varied, self.sc, self.sc.mb_activation
        Pair_, state, parked, MEM_ = Pair, self.state, self.parked, frozenset(MEMORY_KINDS)
        sl = self.slices
        stages, mbs = range(S), range(m)  # a message key in both: its id is arithmetic
        # per rank, what it plays on at every wake-up: its program, times, gathers' end and position per stage,
        # and messages got (id -> (arrival, sent at, receive position)); its links (receiver -> free at)
        ranks = [(p, out.starts[r], out.ends[r], self.gathered_end[r], self.gathered_pos[r], {})
                 for r, p in enumerate(self.programs)]
        links_of = [{} for _ in self.programs]
        mem = self.mem  # per key, when a backward's activations are back (None until a memory action plays)
        while queue:
            r = queue.popleft()
            prog, st, en, g_end, g_pos, gotr = ranks[r]
            i, t, op_start, comm_end, gathers = state[r]
            n, kw = len(prog), -1  # kw: the key it parks on (-1: none it can be woken by, or parked already)
            for i in range(i, n):
                a = prog[i]
                ta = type(a)
                if ta is not Comm_:  # a compute op (every op, without a lowering): the loop's hot path
                    if ta is Pair_:  # an F&B pair (DualPipe's)
                        start, end = self.pair(r, i, a, t, gotr, gathers)
                        if start is None:
                            kw = end
                            break
                        op_start = st[i] = start
                        t = en[i] = end
                        continue
                    kind, s, mb = a
                    k = s * m + mb  # its F's key, its F input's message id
                    base, comm = t, 0.0
                    # dk: the key it makes (-1: none), ik: its input's (x: that input's link time), which is
                    # made on another rank when a message carries it: that message's id is dk
                    if kind == "F":
                        dk, ik, x = k, k - m, f_lat[s]
                    elif kind == "W":
                        dk, ik, x = -1, n_keys + k, 0.0  # its I's, here
                    elif kind in MEM_:  # on the host stream, or a recompute on this one
                        got = self.memory(r, i, a, k, t, op_start)
                        if got is None:
                            break
                        t, op_start = got
                        mem = self.mem
                        continue
                    else:
                        dk = n_keys + k
                        y = done[k]  # its F's, here
                        if y < 0:
                            kw = k
                            break
                        if y > base:
                            base = y
                        ik, x = dk + m, g_lat[s]
                    if sl > 1 and dk >= 0:  # a neighbour slice's forward or backward on this stage
                        y = self.slice_ready(kind, mb, dk)
                        if y < -1.0:
                            kw = int(-y - 2.0)
                            break
                        if y > base:
                            base = y
                    if x >= 0.0:  # computed here, or a message as its link time
                        y = done[ik]
                        if y < 0:
                            kw = ik
                            break
                        if ma is not None and x > 0.0:  # its bytes scale with the micro-batch's tokens
                            x = sc.message_of(s - 1 if kind == "F" else s, mb)
                        y += x
                        if y > base:
                            base = y
                    elif x == _MESSAGE:
                        g = gotr.get(dk)
                        if g is None:  # its receive is not before it: never posted
                            break
                        comm, y, via = g
                        if y > base:
                            base = y
                    if mem is not None and dk >= n_keys and mem[k] > base:  # a backward: its reload or recompute
                        base = self.back(r, i, k, base)
                    if gathers and g_end[s] > comm:
                        comm, via = g_end[s], g_pos[s]
                    if comm > base:  # it waited for a transfer beyond everything else it needed (comm > 0: via set)
                        start = comm
                        out.exposed[r][via] += comm - base
                        out.waited[r][i] = via
                    else:
                        start = base
                    op_start = start
                    t = start + (sc.duration(kind, s, mb) if varied else dur[kind][s])
                    st[i] = start
                    en[i] = t
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
                        occ, delay = (nbytes * ma[mb] if ma is not None and mb in mbs else nbytes) / bw, lat
                    elif ma is not None and mb in mbs:
                        occ, delay = 0.0, sc.message_of(s2 if back else s, mb)
                    else:  # no bytes: the cost model's message time of that boundary
                        occ, delay = 0.0, message[s2 if back else s]  # (the boundary between s and s2)
                    post = op_start if during else t
                    links = links_of[r]
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
                    self.wake(n2 + mid)
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
                elif kind in HEADERS_:  # a message's header: off the hot path (pre-split micro-batches)
                    x = self.header(r, i, a, t, links_of[r])
                    if x < 0:
                        kw = n2 + self.header_id(a)
                        break
                    t = x
                else:  # a collective: ``post``
                    c = self.post(r, i, a, t, op_start, comm_end)
                    if c < 0:
                        break
                    comm_end = c
                    gathers = gathers or kind == UNSHARD_
            else:  # through its program
                i = n
            if i < n:
                parked[r] = kw
                if kw >= 0:  # parked until key ``kw`` is done or arrives
                    if waiter[kw] < 0:
                        waiter[kw] = r
                    else:
                        extra.setdefault(kw, []).append(r)
            state[r] = (i, t, op_start, comm_end, gathers)
        if any(x[0] < len(p) for x, p in zip(state, self.programs)):
            raise Stuck(self.blocked())
        if self.low is not None:
            self.tail()
        return out

    def slice_ready(self, kind: str, mb: int, dk: int) -> float:
        """When the slice an F or a B|I of unit ``mb`` (making key ``dk``) waits for on its stage was done: the
        previous slice's forward, the next slice's backward; -1 when it waits for none, -(key + 2) when that is
        not done yet."""
        j = mb % self.slices
        if kind == "F":
            if j == 0:
                return -1.0
            key = dk - 1
        else:
            if j == self.slices - 1:
                return -1.0
            key = dk + 1
        y = self.done[key]
        return y if y >= 0 else -(key + 2.0)

    def wake(self, k: int) -> None:
        """Key ``k`` (a compute result or a message) is there: the ranks parked on it go back on the work list."""
        w = self.waiter[k]
        if w >= 0:
            self.waiter[k] = -1
            self.queue.append(w)
            if self.extra:
                self.queue.extend(self.extra.pop(k, ()))

    def post(self, r: int, i: int, a, t: float, op_start: float, comm_end: float) -> float:
        """Play collective ``a`` at position ``i`` of rank ``r`` (free at ``t``, its last op started at
        ``op_start``, what it posted done at ``comm_end``): on its stream from when it is posted and the
        stream is free. The rank's new ``comm_end``, or -1 when it waits for the other members."""
        kind, s, mb, peer, group, nbytes, stream, op, during = a
        key = (kind, group, op, nbytes, peer, stream)
        d, sid, cross = self.colls[r].get(key) or self.collective(r, a, key)
        UNSHARD_, ALL_TO_ALL_ = self.kinds[5:7]
        if kind == ALL_TO_ALL_ and self.sc.mb_activation is not None and 0 <= mb < self.m:
            d *= self.sc.mb_activation[mb]  # its bytes are its micro-batch's tokens
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
        if kind == UNSHARD_ and 0 <= s < self.S:  # (no op reads another stage's)
            self.gathered_end[r][s], self.gathered_pos[r][s] = end, i
        self.played_colls[r].append(i)
        return end if kind != ALL_TO_ALL_ and end > comm_end else comm_end

    def collective(self, r: int, a, key: tuple) -> tuple:
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

    def header_id(self, a) -> int:
        """The message id of header ``a`` (a send or receive): given on first sight, as an odd key's."""
        d, s, mb = a.key
        return self.odd_id(2 + (d == "B"), s, mb)  # 2, 3: never a data message's (False, True)

    def header(self, r: int, i: int, a, t: float, links: dict) -> float:
        """Play header ``a`` at position ``i`` of rank ``r`` (free at ``t``; ``links``: its links' free
        times): a send goes on its link like a message (its bytes, the latency); a receive holds the rank until
        the header has arrived. The rank's new free time, or -1 when the header is not sent yet."""
        from .comm_actions import HEADER_SENDS

        mid = self.header_id(a)
        if a.kind in HEADER_SENDS:
            occ = a.nbytes / self.bw if self.bw and a.nbytes > 0 else 0.0
            x = links.get(a.peer, 0.0)
            start = x if x > t else t
            links[a.peer] = start + occ
            self.out.starts[r][i], self.out.ends[r][i] = start, start + occ + self.lat
            self.arrive_at[mid], self.arrive_sent[mid] = start + occ + self.lat, t
            self.wake(2 * self.n_keys + mid)
            return t
        x = self.arrive_at[mid]
        if x < 0:
            return -1.0
        self.out.starts[r][i], self.out.ends[r][i] = self.arrive_sent[mid], x
        if x > t:
            self.out.exposed[r][i] += x - t
            return x
        return t

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

    def pair(self, r: int, i: int, op: Pair, t: float, gotr: dict, gathers: bool) -> tuple:
        """Play F&B pair ``op`` at position ``i`` of rank ``r`` (free at ``t``): (start, end), or
        (None, the key it waits on; -1: none it can be woken by)."""
        base, comm, via = t, 0.0, -1
        for x in op:
            got = self.ready(x, gotr)
            if len(got) == 1:
                return None, got[0]
            b, c, v = got
            if b > base:
                base = b
            if c > comm:
                comm, via = c, v
            if gathers and self.gathered_end[r][x[1]] > comm:
                comm, via = self.gathered_end[r][x[1]], self.gathered_pos[r][x[1]]
        if comm > base:  # it waited for a transfer beyond everything else it needed (comm > 0: via set)
            self.out.exposed[r][via] += comm - base
            self.out.waited[r][i] = via
            base = comm
        (_, fs, fm), (bk, bs, bm) = op
        key = (fs, bk, bs, fm, bm) if self.varied else (fs, bk, bs)
        d = self.pair_dur.get(key)
        if d is None:
            d = self.pair_dur[key] = op_time(op, self.sc)
        end = base + d
        m, n_keys, done = self.m, self.n_keys, self.done
        for kind, s, mb in op:
            if kind != "W":
                k = s * m + mb if kind == "F" else n_keys + s * m + mb
                done[k] = end
                self.wake(k)
        return base, end

    def ready(self, a, gotr: dict) -> tuple:
        """(ready from compute, ready with transfers, position of the transfer that came last) of plain action
        ``a``, or a 1-tuple of the key it waits on (-1: a receive not before it, never posted): the loop's
        reading of an op's inputs, for an F&B pair's halves."""
        kind, s, mb = a
        m, done = self.m, self.done
        k, base = s * m + mb, 0.0
        if kind == "F":  # its input's key, that input's message id and link time
            ik, mid, link = k - m, k, self.f_lat[s]
        elif kind == "W":
            ik, mid, link = self.n_keys + k, -1, 0.0
        else:
            base = done[k]
            if base < 0:
                return (k,)
            if self.mem is not None and self.mem[k] > base:
                base = self.mem[k]  # (a pair's waits are not attributed to its reload)
            mid = self.n_keys + k
            ik, link = mid + m, self.g_lat[s]
        if self.slices > 1 and kind != "W":
            y = self.slice_ready(kind, mb, k if kind == "F" else mid)
            if y < -1.0:
                return (int(-y - 2.0),)
            if y > base:
                base = y
        if link >= 0.0:  # computed here, or a message as its link time
            x = done[ik]
            if x < 0:
                return (ik,)
            if self.sc.mb_activation is not None and link > 0.0:  # its bytes scale with its tokens
                link = self.sc.message_of(s - 1 if kind == "F" else s, mb)
            x += link
            return x if x > base else base, 0.0, -1
        if link == _MESSAGE:
            g = gotr.get(mid)
            if g is None:
                return (-1,)
            arrival, sent, where = g
            return sent if sent > base else base, arrival, where
        return base, 0.0, -1

    def memory(self, r: int, i: int, a: Action, k: int, t: float, op_start: float) -> tuple | None:
        """Play memory action ``a`` (key ``k``) at position ``i`` of rank ``r``, free at ``t``, its last compute
        op started at ``op_start``: (the rank's new free time, its last compute op's start), or None when what it
        follows has not run (an invalid order: the rank never gets past it)."""
        kind, s, mb = a
        if self.mem is None:
            self.mem = [-1.0] * self.n_keys
            self.mem_pos = [-1] * self.n_keys  # the RELOAD (or RECOMPUTE) a backward waits for
            self.offloaded = [-1.0] * self.n_keys  # an OFFLOAD's end
            self.host_free = [0.0] * len(self.programs)
        f_end = self.done[k]
        if kind == RELOAD:
            after = self.offloaded[k]
        else:
            after = f_end
        if after < 0:
            return None
        st, en = self.out.starts[r], self.out.ends[r]
        if kind in HOST_KINDS:  # the host stream, FIFO; the rank goes on
            start = max(t, after, self.host_free[r])
            end = self.host_free[r] = start + self.sc.host_time(s, mb)
            st[i], en[i] = start, end
            if kind == OFFLOAD:
                self.offloaded[k] = end
            else:
                self.mem[k], self.mem_pos[k] = end, i
            return t, op_start
        if self.sc.recomputed is not None and self.sc.recomputed[s]:
            raise CostError(f"{a}: stage {s} recomputes inside its backward (Costs.recompute, --recompute without "
                            "--recompute-at) and its program places a RECOMPUTE too; give one of them")
        start = t if t > after else after
        end = start + self.sc.duration(kind, s, mb)
        st[i], en[i] = start, end
        self.mem[k], self.mem_pos[k] = end, i
        return end, start

    def back(self, r: int, i: int, k: int, base: float) -> float:
        """A backward at position ``i`` of rank ``r``, ready at ``base`` from everything else, that waits for
        its unit's RELOAD or RECOMPUTE: its new ready time; a reload's wait is that transfer's exposed time."""
        end, via = self.mem[k], self.mem_pos[k]
        if self.programs[r][via][0] == RELOAD:
            self.out.exposed[r][via] += end - base
            self.out.waited[r][i] = via
        return end

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

    def blocked(self) -> list[Blocked]:
        """Each rank that did not finish, at its next op, with the compute input it waits for (a transfer's
        wait: the op itself, ``Action(str(op), -1, -1)``)."""
        n, m, out = self.n_keys, self.m, []
        for r, prog in enumerate(self.programs):
            i, k = self.state[r][0], self.parked[r]
            if i < len(prog):
                a = prog[i]
                if 0 <= k < 2 * n:
                    s, mb = divmod(k % n, m)
                    wait = Action("F" if k < n else "B|I", s, mb)
                elif type(a) is Action and a.kind in MEMORY_KINDS:  # what it runs after, behind it
                    wait = Action(OFFLOAD if a.kind == RELOAD else "F", a.stage, a.mb)
                else:
                    wait = Action(str(prog[i]), -1, -1)
                out.append(Blocked(r, i, prog[i], wait))
        return out


def _comm_kinds() -> tuple:
    """What the loop tells communication actions by: their type and kinds (the lowering's)."""
    from .comm_actions import ALL_TO_ALL, HEADERS, RECV_B, RECVS, SEND_B, SENDS, UNSHARD, CommAction

    return CommAction, SENDS, RECVS, SEND_B, RECV_B, UNSHARD, ALL_TO_ALL, HEADERS


def _last_op(prog, comm_type) -> int:
    """Position of a program's last compute op (-1: none)."""
    for k in range(len(prog) - 1, -1, -1):
        if type(prog[k]) is not comm_type:
            return k
    return -1
