"""Why a rank waits: for each idle gap of a timeline, the action it waits for and the chain back to its cause.

An op starts when its rank is free and its inputs have arrived (the
dependency rules, as the engine applies them: ``F(s)`` needs ``F(s-1)``, ``B|I(s)``
need ``F(s)`` and the gradient of ``s+1``, ``W(s)`` needs ``I(s)``, and with sequence
slices a slice's forward needs the previous slice's on its stage (its keys and
values), a slice's backward the next slice's (their gradients); lanes start and
end where the engine's do). An op that starts after its rank was free waited for
its latest input; that input's op may have waited in turn, and so on: the chain
follows these waits back until an op that started as soon as its own rank was
free. Where the chain ends names the first cause:

- **fill**: at the step's first action: the first micro-batch has not got here yet;
- **link**: the waited-for result was ready in time and the gap is the message in flight,
  or more than half of the gap goes when the timeline is simulated again with free links;
- **slow stage**: an op on the chain, or the one keeping the chain's last rank busy, is of a
  stage slower than the fastest stage for that kind of op;
- **drain**: the waiting rank has no forward left to fill the wait (its cooldown),
  or its program is done and it waits for the step to end;
- **order**: the rank at the chain's end was busy with other work its program runs first;
- **collective**: on a lowered timeline (``simulate`` with ``Costs.comm``), the op waited for a gather of its
  stage's weights still in flight, or the step's end waits for a reduction, tie or step-end all-reduce
  running past the last op ("waits for the reduce-scatter of stage 3 over fsdp, in flight from 41 to 44").

Only the timeline's times are read (and the costs in ``meta["costs"]``, when there, for
the link times and the stages' durations), so a measured timeline is explained the same way.

>>> from stagewise.schedules import generate
>>> from stagewise.simulate import simulate
>>> gap = explain(simulate(generate("1f1b", 4, 8)))[0]
>>> print(gap.text)
rank 0 idle 4..10 (6): 0B0 waits for 1B0 (gradient from rank 1) <- 2B0 <- 3B0 <- 3F0 <- 2F0 <- 1F0 <- 0F0: \
fill: the chain starts at 0F0, the step's first action
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import NamedTuple

from .actions import Pair, actions_of
from .engine import Stuck, play
from .schedule import Schedule
from .timeline import Timeline
from .validate import check_structure, describe_deadlock, wait_cycle

CAUSES = ("fill", "drain", "slow stage", "link", "order", "collective")
#: what a slice waits for from its neighbour slice on its own stage (``Input.what``)
KEYS, KEY_GRADS = "keys and values", "key and value gradients"
SLICE_INPUTS = (KEYS, KEY_GRADS)
#: a stage is slow when its ops of one kind take this much longer than the fastest stage's (median)
SLOW = 1.05
#: longest chain followed (a chain of waits visits each op at most once, so this only bounds odd inputs)
MAX_CHAIN = 10_000


class At(NamedTuple):
    """An op's place: ``rank`` and its ``pos`` in that rank's program."""

    rank: int
    pos: int


class Input(NamedTuple):
    """An op's input: the op that makes it, what it carries, and the link time to bring it over."""

    at: At
    #: "activation", "gradient" (from another stage), "forward" or "input gradient" (its own stage's), or a
    #: neighbour slice's ``KEYS`` or ``KEY_GRADS`` (its own stage's)
    what: str
    link: float


@dataclass(frozen=True, kw_only=True)
class Step:
    """One link of a chain: the op at ``at`` waited for ``waits_for``, which ended ``in_flight`` before it started."""

    at: At
    waits_for: At
    what: str
    in_flight: float


@dataclass(frozen=True, kw_only=True)
class Gap:
    """An idle gap of a rank, what it waits for and why.

    ``before`` is the op that waits (None: the rank's program is done and it waits for the
    step's end, ``ends_step``). ``chain`` runs from that op back to ``origin``, the op that
    started as soon as its rank was free; ``blocker`` is the op that kept that rank busy
    (None for the fill: the chain starts at the step's first action).
    """

    rank: int
    start: float
    end: float
    before: At | None
    chain: tuple[Step, ...]
    origin: At | None
    blocker: At | None
    cause: str
    text: str
    #: a collective the gap waits for (cause "collective"): (its CommAction, rank, start, end); else None
    comm: tuple | None = None

    @property
    def length(self) -> float:
        return self.end - self.start

    @property
    def waits_for(self) -> At | None:
        return self.chain[0].waits_for if self.chain else None


class _Index:
    """Where each F and each input gradient (B or I) of (stage, micro-batch) runs, and the link times."""

    def __init__(self, schedule: Schedule, message: list[float] | None):
        self.sched, m = schedule, schedule.microbatches
        n = schedule.stages * m
        # positions packed as rank * width + pos: a schedule has up to millions of ops
        self.width = width = 1 + max((len(p) for p in schedule.programs), default=0)
        fwd, grad = [-1] * n, [-1] * n
        for r, prog in enumerate(schedule.programs):
            base = r * width
            for k, op in enumerate(prog):
                if type(op) is Pair:
                    (_, fs, fm), (_, bs, bm) = op
                    fwd[fs * m + fm] = grad[bs * m + bm] = base + k
                elif op[0] == "F":
                    fwd[op[1] * m + op[2]] = base + k
                elif op[0] != "W":
                    grad[op[1] * m + op[2]] = base + k
        self._fwd, self._grad = fwd, grad
        place, msg = schedule.placement, message or [0.0] * schedule.stages
        # the engine's routes: a message into stage s from s-1 (activation) or from s+1 (gradient)
        self.fwd_link = [msg[s - 1] if s and place[s - 1] != place[s] else 0.0 for s in range(schedule.stages)]
        self.bwd_link = [msg[s] if s + 1 < schedule.stages and place[s + 1] != place[s] else 0.0
                         for s in range(schedule.stages)]
        self.first, self.last = schedule.first_stages, schedule.last_stages

    def fwd(self, stage: int, mb: int) -> At | None:
        """Where F(stage, mb) runs."""
        return self._at(self._fwd[stage * self.sched.microbatches + mb])

    def grad(self, stage: int, mb: int) -> At | None:
        """Where the input gradient of (stage, mb) is computed (its B or I)."""
        return self._at(self._grad[stage * self.sched.microbatches + mb])

    def _at(self, code: int) -> At | None:
        return At(*divmod(code, self.width)) if code >= 0 else None

    def inputs(self, at: At) -> tuple[Input, ...]:
        found, k = [], self.sched.slices
        for kind, s, mb in actions_of(self.sched.programs[at.rank][at.pos]):
            if kind == "F":
                if s != self.first[s]:
                    found.append(Input(self.fwd(s - 1, mb), "activation", self.fwd_link[s]))
                if mb % k:
                    found.append(Input(self.fwd(s, mb - 1), KEYS, 0.0))
            elif kind == "W":
                found.append(Input(self.grad(s, mb), "input gradient", 0.0))
            else:
                found.append(Input(self.fwd(s, mb), "forward", 0.0))
                if s != self.last[s]:
                    found.append(Input(self.grad(s + 1, mb), "gradient", self.bwd_link[s]))
                if mb % k < k - 1:
                    found.append(Input(self.grad(s, mb + 1), KEY_GRADS, 0.0))
        return tuple(i for i in found if i.at is not None and i.at != at)


def link_times(timeline: Timeline) -> list[float] | None:
    """Link time per stage boundary from the costs the timeline was simulated with (None if unknown)."""
    costs = timeline.meta.get("costs")
    if costs is None:
        return None
    return list(costs.resolve(timeline.schedule.stages, timeline.schedule.slices).message)


_UNKNOWN = object()


class _Waits:
    """The timeline's ops and what each waited for; chains share their tails, so each op's wait and the
    chain's origin are found once (memoized), and all gaps together cost time linear in the ops."""

    def __init__(self, tl: Timeline):
        self.tl, self.sched = tl, tl.schedule
        self.index = _Index(self.sched, link_times(tl))
        self.t0, self.t1 = tl.origin, tl.finish  # a lowered step's transfers included
        self.compute_end = max((e[-1] for e in tl.ends if e), default=0.0)
        self.eps = 1e-9 * max(1.0, self.t1 - self.t0)
        self._step: dict[At, Step | None] = {}
        self._tails: dict[At, tuple[At, At | None]] = {}  #: op -> (origin, first slow op from it on)
        self.slow, self.last_forward = _per_stage(tl)

    def start(self, at: At) -> float:
        return self.tl.starts[at.rank][at.pos]

    def end(self, at: At) -> float:
        return self.tl.ends[at.rank][at.pos]

    def free(self, at: At) -> float:
        """When the op's rank was free to start it: the end of the op before it (the step's start for the first)."""
        return self.tl.ends[at.rank][at.pos - 1] if at.pos else self.t0

    def op(self, at: At):
        return self.sched.programs[at.rank][at.pos]

    def step(self, at: At) -> Step | None:
        """What the op waited for: its last input to arrive, if the op started after its rank was free, or
        just as that input arrived (a tie: the input is followed, so a chain runs through a stage's F to its
        own B instead of stopping at the rank that happened to be busy until then). None: it did not wait."""
        got = self._step.get(at, _UNKNOWN)
        if got is not _UNKNOWN:
            return got
        ends, st, out = self.tl.ends, self.start(at), None
        ins = self.index.inputs(at)
        if ins:
            b = max(ins, key=lambda i: ends[i.at.rank][i.at.pos] + i.link)
            done = ends[b.at.rank][b.at.pos]
            if st > self.free(at) + self.eps or done + b.link >= st - self.eps:
                out = Step(at=at, waits_for=b.at, what=b.what, in_flight=max(0.0, st - done))
        self._step[at] = out
        return out

    def origin(self, at: At) -> At:
        """The op the chain from ``at`` ends at: one that started as soon as its rank was free."""
        return self._tail(at)[0]

    def slowest(self, at: At) -> At | None:
        """The first op after ``at`` on its chain (its origin included) of a slow (kind, stage); None if none."""
        nxt = self.step(at)
        return self._tail(nxt.waits_for)[1] if nxt else None

    def _tail(self, at: At) -> tuple[At, At | None]:
        """(origin, first slow op from ``at`` on, ``at`` included), memoized along the way."""
        path, cur = [], at
        while cur not in self._tails and len(path) < MAX_CHAIN:
            path.append(cur)
            nxt = self.step(cur)
            if nxt is None:
                break
            cur = nxt.waits_for
        end, found = self._tails.get(cur, (cur, None))
        for x in reversed(path):
            if _kind_stage(self.op(x)) in self.slow:
                found = x
            self._tails[x] = (end, found)
        return self._tails[at]

    def chain(self, at: At) -> list[Step]:
        """The waits from ``at`` back to its origin."""
        steps, cur = [], at
        while len(steps) < MAX_CHAIN and (nxt := self.step(cur)) is not None:
            steps.append(nxt)
            cur = nxt.waits_for
        return steps


class _Why(NamedTuple):
    cause: str
    blocker: At | None
    why: str
    comm: tuple | None = None


def explain(timeline: Timeline) -> list[Gap]:
    """Every idle gap of ``timeline``, rank by rank in time order, each with its wait chain and cause."""
    w, found = _scan(timeline)
    return [_done(w, r, start, why) if at is None else _gap(w, at, start, why) for r, start, at, why in found]


def explain_at(timeline: Timeline, rank: int, pos: int | None) -> Gap | None:
    """The gap before op ``pos`` of ``rank`` (None: the rank's gap at the step's end), or None if there is none."""
    return next((g for g in explain_ranks(timeline, [rank]) if (g.before.pos if g.before else None) == pos), None)


def explain_ranks(timeline: Timeline, ranks) -> list[Gap]:
    """The gaps of ``ranks`` only (each chain still reads every rank it passes)."""
    w, found = _scan(timeline, ranks)
    return [_done(w, r, start, why) if at is None else _gap(w, at, start, why) for r, start, at, why in found]


class Brief(NamedTuple):
    """A gap in brief (``gap_causes``): times from the timeline's start; ``pos`` of the op that waits, -1 at
    the rank's end."""

    rank: int
    start: float
    end: float
    pos: int
    cause: str

    @property
    def length(self) -> float:
        return self.end - self.start


def gap_causes(timeline: Timeline) -> list[Brief]:
    """Every gap and its cause, without the chains' text (what the workshop draws; one gap's text is
    ``explain_at``): as fast as ``explain`` is thorough."""
    w, found = _scan(timeline)
    return [Brief(r, start - w.t0, (w.start(at) if at else w.t1) - w.t0, at.pos if at else -1,
                  why.cause if why else "drain") for r, start, at, why in found]


def _scan(timeline: Timeline, ranks=None):
    """The waits of the timeline and (rank, gap start, op that waits or None, _Why) for each gap."""
    w = _Waits(timeline)
    slow, last_forward = w.slow, w.last_forward
    linked = _link_share(timeline)
    waited = _collective_waits(timeline)
    found = []
    for r in range(timeline.ranks) if ranks is None else ranks:
        starts, ends = timeline.starts[r], timeline.ends[r]
        free = w.t0
        for k in range(len(starts)):
            if starts[k] > free + w.eps:
                at = At(r, k)
                got = waited(r, k) if waited else None
                if got is not None and got[3] >= starts[k] - w.eps:
                    found.append((r, free, at, _Why("collective", None, _comm_text(got, w), got)))
                else:
                    share = linked(at, starts[k] - free) if linked else 0.0
                    found.append((r, free, at, _classify(w, at, free, slow, drain=k > last_forward[r], link=share)))
            free = ends[k]
        if starts and free < w.t1 - w.eps:
            found.append((r, free, None, _end_why(w, timeline, free)))
    return w, found


def _collective_waits(tl: Timeline):
    """(rank, op position) -> (CommAction, its rank, start, end) of the collective the op waited for last, on a
    lowered timeline (None: not lowered)."""
    low, played = tl.meta.get("lowered"), tl.meta.get("played")
    if low is None or played is None:
        return None
    from .comm_actions import P2P, CommAction

    ops = [[p for p, a in enumerate(prog) if type(a) is not CommAction] for prog in low.programs]

    def waited(r: int, k: int):
        j = played.waited[r].get(ops[r][k])
        if j is None or low.programs[r][j].kind in P2P:  # a message in flight is the link's
            return None
        return low.programs[r][j], r, played.starts[r][j], played.ends[r][j]

    return waited


def _end_why(w: _Waits, tl: Timeline, free: float):
    """A rank's wait for the step's end: a collective when the transfers past the last op are most of it."""
    tail = w.t1 - max(w.compute_end, free)
    if tl.comm is None or tail <= (w.t1 - free) / 2 + w.eps:
        return None
    # the transfer past the last op that the step's end waits for most (the longest exposed; the last one on a tie)
    r, c = max(((r, c) for r, lane in enumerate(tl.comm) for c in lane if c.kind != "a2a" and c.end > w.compute_end),
               key=lambda rc: (rc[1].exposed, rc[1].end))
    got = (c.action, r, c.start, c.end)
    return _Why("collective", None, _comm_text(got, w), got)


def _comm_text(got, w: _Waits) -> str:
    from .comm_actions import describe

    c, r, start, end = got
    return f"waits for {describe(c, r)} on rank {r}, in flight from {_n(start - w.t0)} to {_n(end - w.t0)}"


def _link_share(tl: Timeline):
    """(op, its gap) -> the part of the gap that free links would remove (None when links are free or the
    costs unknown): the timeline simulated once more with latency and bandwidth off, gap by gap."""
    from dataclasses import replace

    from .simulate import simulate

    costs = tl.meta.get("costs")
    msg = link_times(tl)
    if costs is None or not msg or not any(msg):
        return None
    free = simulate(tl.schedule, replace(costs, latency=0.0, bandwidth=None), check=False)
    t0 = free.origin

    def share(at: At, gap: float) -> float:
        before = free.ends[at.rank][at.pos - 1] if at.pos else t0
        return max(0.0, gap - max(0.0, free.starts[at.rank][at.pos] - before))

    return share


def _classify(w: _Waits, at: At, free: float, slow: dict, *, drain: bool, link: float) -> _Why:
    first, origin = w.step(at), w.origin(at)
    length = w.start(at) - free
    if first is None:  # a measured op that started late with its inputs long there: no dependency explains it
        return _Why("order", None, f"{w.op(at)} started after rank {at.rank} was free, its inputs already there "
                    "(time the runtime spent between ops, not a dependency)")
    blocker = At(origin.rank, origin.pos - 1) if w.free(origin) > w.t0 + w.eps else None
    if blocker is None:
        return _Why("fill", None, f"the chain starts at {w.op(origin)}, the step's first action" + _linked(link, w))
    if first.in_flight >= length - w.eps and first.in_flight > w.eps and first.what not in SLICE_INPUTS:
        return _Why("link", blocker, f"the {first.what} was in flight from rank {first.waits_for.rank} for "
                    f"{_n(first.in_flight)}")
    if link > length / 2:
        return _Why("link", blocker, f"free links would remove {_n(link)} of this wait (messages in flight "
                    "along the chain)")
    late = w.slowest(at)
    kind, stage = _kind_stage(w.op(blocker))
    if (kind, stage) in slow:
        fast, took = slow[kind, stage]
        return _Why("slow stage", blocker, f"rank {blocker.rank} was busy with {w.op(blocker)} (stage {stage}'s "
                    f"{kind} takes {_n(took)}; the fastest stage's {_n(fast)})" + _linked(link, w))
    if late is not None:
        kind, stage = _kind_stage(w.op(late))
        fast, took = slow[kind, stage]
        return _Why("slow stage", blocker, f"{w.op(late)} on rank {late.rank} lies on the chain (stage {stage}'s "
                    f"{kind} takes {_n(took)}; the fastest stage's {_n(fast)})" + _linked(link, w))
    if drain:
        return _Why("drain", blocker, f"rank {at.rank} has no forward left to run; rank {blocker.rank} was busy "
                    f"with {w.op(blocker)}" + _linked(link, w))
    return _Why("order", blocker, f"rank {blocker.rank} was busy with {w.op(blocker)}, which its program runs "
                "first" + _linked(link, w))


def _slice_wait(step: Step, w: _Waits) -> str:
    """A wait for a neighbour slice on the same stage, in words: "slice 1 waits for slice 0's forward on this
    stage: its keys and values"."""
    k = w.sched.slices
    waiting, waited = (a.mb % k for a in (w.op(step.at), w.op(step.waits_for)))
    if step.what == KEYS:
        return f"slice {waiting} waits for slice {waited}'s forward on this stage: its keys and values"
    return f"slice {waiting} waits for slice {waited}'s backward on this stage: the gradients of its keys and values"


def _linked(link: float, w: _Waits) -> str:
    return f" ({_n(link)} of the wait is link time)" if link > w.eps else ""


def _gap(w: _Waits, at: At, free: float, why: _Why) -> Gap:
    head = _head(at.rank, free, w.start(at), w.t0)
    if why.cause == "collective":
        return Gap(rank=at.rank, start=free, end=w.start(at), before=at, chain=(), origin=at, blocker=None,
                   cause=why.cause, text=f"{head}{w.op(at)} {why.why}: collective", comm=why.comm)
    steps = w.chain(at)
    if not steps:
        return Gap(rank=at.rank, start=free, end=w.start(at), before=at, chain=(), origin=at, blocker=None,
                   cause=why.cause, text=f"{head}{why.why}")
    first = steps[0]
    links = " <- ".join(str(w.op(s.waits_for)) + (f" ({_slice_wait(s, w)})" if s.what in SLICE_INPUTS else "")
                        for s in steps[1:])
    source = _slice_wait(first, w) if first.what in SLICE_INPUTS else f"{first.what} from rank {first.waits_for.rank}"
    text = (f"{w.op(at)} waits for {w.op(first.waits_for)} ({source})"
            + (f" <- {links}" if links else "") + f": {why.cause}: {why.why}")
    return Gap(rank=at.rank, start=free, end=w.start(at), before=at, chain=tuple(steps), origin=w.origin(at),
               blocker=why.blocker, cause=why.cause, text=head + text)


def _done(w: _Waits, r: int, free: float, why: _Why | None = None) -> Gap:
    last = max((At(q, len(p) - 1) for q, p in enumerate(w.sched.programs) if p), key=w.end)
    if why is not None:
        return Gap(rank=r, start=free, end=w.t1, before=None, chain=(), origin=last, blocker=None,
                   cause=why.cause, text=_head(r, free, w.t1, w.t0) + f"rank {r} has run its program and "
                   f"{why.why}: collective", comm=why.comm)
    text = (f"rank {r} has run its program: drain: the step ends at {_n(w.t1 - w.t0)} when {w.op(last)} ends on "
            f"rank {last.rank}")
    if w.t1 > w.compute_end + w.eps:  # lowered: transfers run past the last op
        text = (f"rank {r} has run its program: drain: {w.op(last)} ends on rank {last.rank} at "
                f"{_n(w.compute_end - w.t0)}, the step at {_n(w.t1 - w.t0)} when its transfers are done")
    return Gap(rank=r, start=free, end=w.t1, before=None, chain=(), origin=last, blocker=None, cause="drain",
               text=_head(r, free, w.t1, w.t0) + text)


def _head(rank: int, start: float, end: float, t0: float = 0.0) -> str:
    return f"rank {rank} idle {_n(start - t0)}..{_n(end - t0)} ({_n(end - start)}): "


def _kind_stage(op) -> tuple[str, int]:
    return ("F&B", op.forward.stage) if type(op) is Pair else (op.kind, op.stage)


def _per_stage(tl: Timeline) -> tuple[dict[tuple[str, int], tuple[float, float]], list[int]]:
    """The slow stages: (kind, stage) -> (fastest stage's median, this stage's) where slower than the fastest
    by SLOW; and per rank, the position of its last op with a forward (-1: none)."""
    last_forward = []
    for prog in tl.schedule.programs:
        k = len(prog) - 1
        while k >= 0 and not (type(prog[k]) is Pair or prog[k][0] == "F"):
            k -= 1
        last_forward.append(k)
    med = _durations(tl)
    fastest: dict[str, float] = {}
    for (kind, _), x in med.items():
        fastest[kind] = min(x, fastest.get(kind, x))
    slow = {key: (fastest[key[0]], x) for key, x in med.items() if x > fastest[key[0]] * SLOW + 1e-12}
    return slow, last_forward


def _durations(tl: Timeline) -> dict[tuple[str, int], float]:
    """(kind, stage) -> how long its ops take: the costs' durations for a simulated timeline, else the median of
    the measured ones; F&B pairs by their forward's stage, always as measured."""
    costs = tl.meta.get("costs")
    pairs_only = costs is not None
    took: dict[tuple[str, int], list[float]] = {}
    for r in range(tl.ranks):
        for op, s, e in tl.rows(r):
            if type(op) is Pair:
                took.setdefault(("F&B", op.forward.stage), []).append(e - s)
            elif not pairs_only:
                took.setdefault((op.kind, op.stage), []).append(e - s)
    out = {key: statistics.median(xs) for key, xs in took.items()}
    if costs is not None:
        sc = costs.resolve(tl.schedule.stages, tl.schedule.slices)
        out.update({(k, s): sc.duration(k, s) for k in "FBIW" for s in range(tl.schedule.stages)})
    return out


def idle_by_cause(gaps) -> dict[str, float]:
    """Idle time of all ranks together, per cause, of ``Gap``s or ``Brief``s (every cause listed; they sum to
    the bubble's idle time)."""
    out = dict.fromkeys(CAUSES, 0.0)
    for g in gaps:
        out[g.cause] += g.length
    return out


def gap_dict(g: Gap, timeline: Timeline) -> dict:
    """A gap as JSON: times from the timeline's start, ops as text with their rank and position."""
    t0 = timeline.origin
    progs = timeline.schedule.programs

    def ref(at: At | None) -> dict | None:
        return None if at is None else {"op": str(progs[at.rank][at.pos]), "rank": at.rank, "position": at.pos}

    return {"rank": g.rank, "start": g.start - t0, "end": g.end - t0, "length": g.length, "cause": g.cause,
            "before": ref(g.before), "waits_for": ref(g.waits_for),
            "chain": [{**ref(s.waits_for), "what": s.what, "in_flight": s.in_flight} for s in g.chain],
            "origin": ref(g.origin), "blocker": ref(g.blocker), "text": g.text,
            **({"comm": {"action": str(g.comm[0]), "rank": g.comm[1], "start": g.comm[2] - t0,
                         "end": g.comm[3] - t0}} if g.comm else {})}


def messages(timeline: Timeline) -> list[tuple[At, At, str, float]]:
    """Every activation and gradient crossing ranks, as (sender, receiver, what, arrival): the sender's result
    is sent at its end and arrives the link time later (what the engine's receiver waits for)."""
    index = _Index(timeline.schedule, link_times(timeline))
    sched, ends, m, width = timeline.schedule, timeline.ends, timeline.schedule.microbatches, index.width
    fwd, grad, place, out = index._fwd, index._grad, sched.placement, []
    for lane in sched.lanes:
        for s in range(lane.stage_lo, lane.stage_hi - 1):
            if place[s] == place[s + 1]:
                continue
            for mb in lane.mbs:
                for src, dst, what, link in ((fwd[s * m + mb], fwd[(s + 1) * m + mb], "activation",
                                              index.fwd_link[s + 1]),
                                             (grad[(s + 1) * m + mb], grad[s * m + mb], "gradient",
                                              index.bwd_link[s])):
                    if src >= 0 and dst >= 0:
                        a, b = At(*divmod(src, width)), At(*divmod(dst, width))
                        out.append((a, b, what, ends[a.rank][a.pos] + link))
    return out


@dataclass(frozen=True, kw_only=True)
class Deadlock:
    """A schedule whose ranks stop: the validator's message, the wait cycle, and what ran before."""

    message: str
    cycle: tuple[tuple[At, At], ...]  #: (blocked op, the op it waits for), around the cycle (or the chain)
    closed: bool  #: the waits return to a rank (a cycle); False: they end at a rank that is not blocked
    ran: Timeline  #: each rank's program up to its blocked op, as simulated (times as in a full run)
    blocked: tuple[At | None, ...]  #: per rank, its next op (None: the rank finished)


def deadlock(schedule: Schedule, costs) -> Deadlock | None:
    """None if ``schedule`` runs to the end under ``costs``; else where and why its ranks stop.

    Raises ``ScheduleError`` for a structural problem (a missing or duplicate action, a stage on
    the wrong rank), as the validator does.
    """
    check_structure(schedule)
    sc = costs.resolve(schedule.stages, schedule.slices)
    try:
        play(schedule, sc)
        return None
    except Stuck as stuck:
        waits, closed = wait_cycle(schedule, stuck)
        head = {b.rank: b.position for b in stuck.blocked}
        message = describe_deadlock(schedule, stuck)
    upto = [head.get(r, len(p)) for r, p in enumerate(schedule.programs)]
    prefix = Schedule(name=schedule.name, programs=tuple(p[:n] for p, n in zip(schedule.programs, upto)),
                      placement=schedule.placement, microbatches=schedule.microbatches, lanes=schedule.lanes)
    # the ops before each rank's blocked one ran in the full run, in this order, so they run here
    # with the same times (start times do not depend on the order ranks are advanced in)
    starts, ends = play(prefix, sc)
    ran = Timeline(schedule=prefix, starts=tuple(map(tuple, starts)), ends=tuple(map(tuple, ends)),
                   activation=tuple(sc.activation), free_at_i=sc.free_at_i, meta={"costs": costs})
    cycle = tuple((At(w.blocked.rank, w.blocked.position), At(*w.target) if w.target else None) for w in waits)
    blocked = tuple(At(r, head[r]) if r in head else None for r in range(schedule.ranks))
    return Deadlock(message=message, cycle=cycle, closed=closed, ran=ran, blocked=blocked)


def _n(x: float) -> str:
    return f"{x:.4g}"


__all__ = ["At", "Input", "Step", "Gap", "Deadlock", "CAUSES", "explain", "explain_at", "explain_ranks", "Brief", "gap_causes",
           "idle_by_cause", "gap_dict", "messages", "deadlock"]
