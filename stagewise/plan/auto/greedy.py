"""The Zero Bubble paper's list scheduler: F, I, W on p ranks (stage r on rank r) under a memory cap.

Each rank, whenever it is free, runs the input-gradient ``I`` that is ready
(it unblocks the rank before), else the forward that is ready (within the
policy's warm-up limit and the memory cap), else a pending weight-gradient
``W`` to fill what would be idle time. Of all ranks' next actions the one that
can start earliest runs first. A rank's next action depends only on its own
state and its two neighbours', so after each action only those three are
re-evaluated (a heap with lazy deletion): linear in the actions, which keeps
p=32, m=256 (24,576 actions) at a fraction of a second per policy.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from ...actions import Action
from ...costs import StageCosts
from ...schedule import Schedule, make

_EPS = 1e-9
INF = float("inf")


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One greedy variant."""

    warmup: tuple[int, ...]  #: per rank: most forwards ahead of its input-gradient backwards
    #: per rank, "any": a W whenever nothing else is ready; "gap": only if it ends before the next ready F/I;
    #: "budget": only once waiting would make the rank the idlest so far
    fill: tuple[str, ...]
    #: before its first I, a rank starts no forward that would end after that I could start at the earliest
    #: (the paper's "bubble before the first B": a short wait rather than a late gradient down the chain)
    hold: bool = False

    def describe(self) -> str:
        fills = set(self.fill)
        fill = self.fill[0] if len(fills) == 1 else ",".join(self.fill)
        return f"warmup={list(self.warmup)} fill={fill}" + (" hold" if self.hold else "")


class Outcome(NamedTuple):
    """An order and its times (the simulator's: both start each action at max(rank free, inputs ready))."""

    schedule: Schedule
    makespan: float
    span: float  #: the longest rank's own span, first start to last end


def greedy(p: int, m: int, sc: StageCosts, size: Sequence[float], cap: Sequence[float], pol: Policy
           ) -> Outcome | None:
    """The order the policy makes; None if the memory cap leaves every rank nothing to run."""
    st = _State(p, m, sc, size, cap, pol)
    heap: list[tuple[float, str, int, int]] = []
    version = [0] * p

    def refresh(r: int) -> None:
        version[r] += 1
        c = st.candidate(r)
        if c is not None:
            heapq.heappush(heap, (c[0], c[1], r, version[r]))

    for r in range(p):
        refresh(r)
    for _ in range(3 * p * m):
        while heap and heap[0][3] != version[heap[0][2]]:
            heapq.heappop(heap)  # stale: that rank's state changed since
        if not heap:
            return None
        start, kind, r, _ = heapq.heappop(heap)
        if not st.done[r]:
            st.first[r] = start
        st.run(r, kind, start)
        for q in (r - 1, r, r + 1):
            if 0 <= q < p:
                refresh(q)
    span = max(end - first for end, first in zip(st.clock, st.first))
    return Outcome(make("auto", st.programs, range(p), m), max(st.clock), span)


class _State:
    """The greedy's progress. Mutable: it is the schedule being built."""

    def __init__(self, p: int, m: int, sc: StageCosts, size: Sequence[float], cap: Sequence[float], pol: Policy):
        self.p, self.m, self.sc, self.size, self.cap, self.pol = p, m, sc, size, cap, pol
        self.f_done = [[INF] * m for _ in range(p)]
        self.i_done = [[INF] * m for _ in range(p)]
        self.nf, self.ni, self.done = [0] * p, [0] * p, [0] * p
        self.pending: list[list[int]] = [[] for _ in range(p)]
        self.next_w = [0] * p  #: index into pending of the next W (W's run in I order)
        self.clock, self.live, self.first = [0.0] * p, [0.0] * p, [0.0] * p
        self.idle = [0.0] * p  #: idle time inside each rank's span so far
        self.programs: list[list[Action]] = [[] for _ in range(p)]
        self.first_i = _earliest_first_i(p, sc)

    def candidate(self, r: int) -> tuple[float, str] | None:
        """(start, kind) of what rank r would run next; None if nothing is known to be ready."""
        if self.done[r] >= 3 * self.m:
            return None
        t, pol = self.clock[r], self.pol
        f_ok = self.nf[r] - self.ni[r] < pol.warmup[r] and \
            self.live[r] + self.size[r] <= self.cap[r] * (1 + _EPS)
        tf = max(t, self.f_ready(r)) if f_ok else INF
        if pol.hold and self.ni[r] == 0 and self.nf[r] > 0 and tf + self.sc.f[r] > self.first_i[r] + _EPS:
            tf = INF  # wait for the first gradient rather than delay it
        ti = max(t, self.i_ready(r))
        nxt = min(ti, tf)
        owed = self.next_w[r] < len(self.pending[r])
        if owed and nxt > t and self.fills(r, t, nxt):
            return t, "W"  # fill what would be idle time
        if nxt == INF:
            return (t, "W") if owed else None
        return (ti, "I") if ti <= tf else (tf, "F")

    def fills(self, r: int, t: float, nxt: float) -> bool:
        """Whether rank r fills the wait from t to nxt with a W, by its fill rule."""
        rule = self.pol.fill[r]
        if rule == "any":
            return True
        if rule == "gap":
            return t + self.sc.w[r] <= nxt + _EPS
        # "budget" (the paper's no-bubble greedy): keep the W for later while this wait leaves the rank
        # no idler than the idlest rank so far
        return nxt == INF or self.idle[r] + (nxt - t) > max(self.idle) + _EPS

    def f_ready(self, r: int) -> float:
        if self.nf[r] >= self.m:
            return INF
        return 0.0 if r == 0 else self.f_done[r - 1][self.nf[r]] + self.sc.message[r - 1]

    def i_ready(self, r: int) -> float:
        j = self.ni[r]
        if j >= self.nf[r]:
            return INF
        if r == self.p - 1:
            return self.f_done[r][j]
        return max(self.f_done[r][j], self.i_done[r + 1][j] + self.sc.message[r])

    def run(self, r: int, kind: str, start: float) -> None:
        sc, size = self.sc, self.size[r]
        if self.done[r]:
            self.idle[r] += start - self.clock[r]
        if kind == "F":
            j = self.nf[r]
            self.nf[r] += 1
            end = self.f_done[r][j] = start + sc.f[r]
            self.live[r] += size
        elif kind == "I":
            j = self.ni[r]
            self.ni[r] += 1
            end = self.i_done[r][j] = start + sc.i[r]
            self.pending[r].append(j)
            self.live[r] -= size * sc.free_at_i
        else:
            j = self.pending[r][self.next_w[r]]
            self.next_w[r] += 1
            end = start + sc.w[r]
            self.live[r] -= size * (1 - sc.free_at_i)
        self.programs[r].append(Action(kind, r, j))
        self.clock[r] = end
        self.done[r] += 1


def _earliest_first_i(p: int, sc: StageCosts) -> list[float]:
    """When I of micro-batch 0 could start on each rank if nothing waited: the forward chain down, the I chain up."""
    t = 0.0
    for r in range(p):
        t += sc.f[r] + (sc.message[r - 1] if r else 0.0)
    out = [0.0] * p
    for r in range(p - 1, -1, -1):
        out[r] = t
        if r:
            t += sc.i[r] + sc.message[r - 1]
    return out
