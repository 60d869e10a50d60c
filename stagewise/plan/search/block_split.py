"""A fast split for models made of identical blocks between an embedding and a head (E, t*n, H).

At cluster scale every block costs the same, so a split is a number of blocks per
piece. Water-filling hands the next block to the least loaded rank (and, within
it, to its lightest piece) unless that breaks the rank's memory limit. With one
piece per rank this is exact: the pieces' memory grows with their own blocks
only, and equal increments make the greedy min-max optimal (the same argument
as ``partition._waterfill``). With several pieces per rank, or a piece on two
ranks (DualPipe), it is a feasible greedy, not a proven optimum. The embedding
and the head start their pieces' loads, so the first and last stage get fewer
blocks when they are heavier.
"""

from __future__ import annotations

import heapq
import math
from operator import mul

from .holding import Holding
from .partition import LayerCosts, _rank_memory, _Sums, runs_of

_EPS = 1e-9


def is_block_model(lc: LayerCosts) -> bool:
    """The shape E, t*n, H: identical layers between a distinct first and last one."""
    runs = runs_of(lc)
    return len(runs) == 3 and runs[0] == (0, 1) and runs[2] == (len(lc.time) - 1, len(lc.time))


def block_split(lc: LayerCosts, h: Holding, limit: float | None, later: bool = False) -> tuple[int, ...] | None:
    """Layers per piece, or None when the greedy finds no split within ``limit`` bytes per rank. Of ranks as
    loaded the first, and of its pieces as loaded the first, takes the next block (``later``: the last rank and
    its last piece, a split as balanced that the schedule may play faster: ``ClusterSearcher`` plays both)."""
    S, L = h.pieces, len(lc.time)
    blocks, t = L - 2, lc.time[1]
    sums = _Sums(lc)
    n = [0] * S  # blocks per piece
    piece_ranks: dict[int, set[int]] = {}
    share = [0.0] * S
    for s, k in enumerate(h.stage_piece):
        piece_ranks.setdefault(k, set()).add(h.stage_rank[s])
        share[k] += h.stage_share[s]
    ends = [(lc.time[0] if k == 0 else 0.0) + (lc.time[-1] if k == S - 1 else 0.0) for k in range(S)]
    low = [0 if k in (0, S - 1) else 1 for k in range(S)]
    if S == 1:
        low = [0]
    n = list(low)
    if sum(n) > blocks:
        return None
    if any(len(r) > 1 for r in piece_ranks.values()):  # a piece on two ranks (DualPipe's two lanes)
        return _shared(sums, h, n, blocks, ends, t, limit)
    rank_of = {k: next(iter(r)) for k, r in piece_ranks.items()}
    pieces_of: dict[int, list[int]] = {}
    for k in range(S):
        pieces_of.setdefault(rank_of[k], []).append(k)

    def load(r: int) -> float:
        return sum(share[k] * (ends[k] + t * n[k]) for k in pieces_of[r])

    fast = _BlockMemory.of(lc, h)

    def memory(r: int) -> float:
        if fast is not None:
            return fast.rank(r, n)
        return _rank_memory(sums, h, r, [_span(n, k) for k in _stages_order(h, r)])

    if limit is not None and any(memory(r) > limit * (1 + _EPS) for r in pieces_of):
        return None
    heap = [(load(r), -r if later else r, r) for r in pieces_of]
    heapq.heapify(heap)
    for _ in range(blocks - sum(n)):
        while heap:
            _, _, r = heapq.heappop(heap)
            k = _place(r, pieces_of[r], n, ends, share, t, limit, memory, later)
            if k is not None:
                heapq.heappush(heap, (load(r), -r if later else r, r))
                break
        else:
            return None
    return tuple(n[k] + (k == 0) + (k == S - 1) for k in range(S))


def _shared(sums, h: Holding, n: list[int], blocks: int, ends, t: float, limit) -> tuple[int, ...] | None:
    """Greedy for pieces held by several ranks: each block goes to the piece whose busiest holder stays
    least loaded (and within the memory limit). Feasible, not proven optimal."""
    S = len(n)
    held = [[(h.stage_rank[s], h.stage_share[s]) for s in range(len(h.stage_piece)) if h.stage_piece[s] == k]
            for k in range(S)]
    load = [0.0] * h.ranks
    for k in range(S):
        for r, share in held[k]:
            load[r] += share * (ends[k] + t * n[k])

    fast = _BlockMemory.of(sums.lc, h)

    def rank_memory(r: int) -> float:
        if fast is not None:
            return fast.rank(r, n)
        return _rank_memory(sums, h, r, [_span(n, h.stage_piece[s]) for s in h.rank_stages[r]])

    def fits(k: int) -> bool:
        return limit is None or all(rank_memory(r) <= limit * (1 + _EPS) for r, _ in held[k])

    def grown(k: int) -> float:
        """The most memory a holder of piece k has with one more block in it: ties in load go to the piece
        that grows memory least, so of DualPipe's two pieces on the same two ranks the one with fewer
        micro-batches in flight fills first (without a limit too: the same load, less memory, so the least a
        split that fits nowhere needs is not overstated)."""
        n[k] += 1
        most = max(rank_memory(r) for r, _ in held[k])
        n[k] -= 1
        return most

    for _ in range(blocks - sum(n)):
        for k in _by_load_then_growth(S, held, load, t, grown):
            n[k] += 1
            if fits(k):
                for r, share in held[k]:
                    load[r] += share * t
                break
            n[k] -= 1
        else:
            return None
    return tuple(n[k] + (k == 0) + (k == S - 1) for k in range(S))


def _by_load_then_growth(S: int, held, load, t: float, grown):
    """The pieces in the order of (their busiest holder's load with one more block, ``grown``, index), with
    ``grown`` computed only within a run of equal loads the caller reaches (it stops at the first that fits)."""
    keyed = sorted((max(load[r] + share * t for r, share in held[k]), k) for k in range(S))
    i = 0
    while i < S:
        j = i + 1
        while j < S and keyed[j][0] == keyed[i][0]:
            j += 1
        group = [k for _, k in keyed[i:j]]
        if len(group) > 1:
            group.sort(key=lambda k: (grown(k), k))
        yield from group
        i = j


def _place(r, pieces, n, ends, share, t, limit, memory, later: bool = False) -> int | None:
    """Give rank r's lightest piece that still fits one more block (of equal ones the first, or the last with
    ``later``); None if none fits."""
    for _, _, k in sorted((share[k] * (ends[k] + t * n[k]), -k if later else k, k) for k in pieces):
        n[k] += 1
        if limit is None or memory(r) <= limit * (1 + _EPS):
            return k
        n[k] -= 1
    return None


class _BlockMemory:
    """A rank's memory in closed form when every block holds the same bytes: a piece of n blocks holds its
    end layers' bytes (the embedding in the first, the head in the last) plus n times a block's, so a check is
    a sum over the rank's stages instead of a walk over the layers (what ``partition._rank_memory`` computes,
    the same value)."""

    def __init__(self, lc: LayerCosts, h: Holding):
        self.h, self.S = h, h.pieces
        self.fb, self.ab = lc.fixed[1], lc.act[1]
        self.ends = (lc.fixed[0], lc.fixed[-1], lc.act[0], lc.act[-1])
        self.inputs = (lc.input_bytes[0], lc.input_bytes[1], lc.input_bytes[-1]) if lc.input_bytes else None
        self.pieces = [[h.stage_piece[s] for s in h.rank_stages[r]] for r in range(h.ranks)]
        fe, fh, ae, ah = self.ends
        S = self.S
        #: per rank, (piece, its end layers' fixed bytes, their activation bytes): the first two terms of
        #: ``rank``'s sums, added as it adds them (the same floats)
        self.consts = [[(k, (fe if k == 0 else 0.0) + (fh if k == S - 1 else 0.0),
                         (ae if k == 0 else 0.0) + (ah if k == S - 1 else 0.0)) for k in pieces]
                       for pieces in self.pieces]

    @classmethod
    def of(cls, lc: LayerCosts, h: Holding) -> "_BlockMemory | None":
        blocks = range(1, len(lc.time) - 1)
        same = all(lc.fixed[i] == lc.fixed[1] and lc.act[i] == lc.act[1] for i in blocks)
        if lc.input_bytes is not None:
            same = same and all(lc.input_bytes[i] == lc.input_bytes[1] for i in blocks)
        return cls(lc, h) if same and len(lc.time) > 2 else None

    def rank(self, r: int, n: list[int]) -> float:
        if self.inputs is None:  # no recomputation: the greedy's hot path, ``_rank`` with the ends folded in
            fb, ab = self.fb, self.ab
            fixed, kept = 0.0, []
            for k, cf, ca in self.consts[r]:
                x = n[k]
                fixed += cf + x * fb
                kept.append(ca + x * ab)
            return fixed + max([sum(map(mul, vec, kept)) for vec in self.h.live[r]], default=0.0)
        return self._rank(r, n)

    def _rank(self, r: int, n: list[int]) -> float:
        S, (fe, fh, ae, ah) = self.S, self.ends
        fixed, kept, full = 0.0, [], []
        for k in self.pieces[r]:
            first, last = k == 0, k == S - 1
            fixed += (fe if first else 0.0) + (fh if last else 0.0) + n[k] * self.fb
            act = (ae if first else 0.0) + (ah if last else 0.0) + n[k] * self.ab
            full.append(act)
            if self.inputs is None:
                kept.append(act)
            else:  # a recomputed piece keeps its first layer's input
                kept.append(self.inputs[0] if first else self.inputs[1] if n[k] else self.inputs[2])
        act = max((sum(c * a for c, a in zip(vec, kept)) for vec in self.h.live[r]), default=0.0)
        return fixed + act + (max(full, default=0.0) if self.inputs is not None else 0.0)


def _stages_order(h: Holding, r: int) -> list[int]:
    """Pieces of rank r's stages, in the order ``Holding.live`` counts them."""
    return [h.stage_piece[s] for s in h.rank_stages[r]]


def _span(n: list[int], k: int) -> tuple[int, int]:
    """[start, end) layers of piece k (E is layer 0, H the last)."""
    S = len(n)
    lo = sum(n[:k]) + (1 if k > 0 else 0)
    return lo, lo + n[k] + (k == 0) + (k == S - 1)


def busiest_floor(time, ranks: int, copies: int = 1) -> float:
    """A lower bound on the busiest rank's work per micro-batch under any split of the layers ``time`` (a
    first layer, identical blocks, a last layer) over ``ranks``, each of ``copies`` model copies taking
    1/copies of the micro-batches (DualPipe's two): blocks are whole, so the average share is not always
    reachable; the first and last layers may land anywhere. 0.0 where the blocks differ."""
    blocks = time[1:-1]
    if not blocks or blocks[0] <= 0 or any(x != blocks[0] for x in blocks):
        return 0.0
    t, need = blocks[0], copies * len(blocks)
    ends = [time[0]] * copies + [time[-1]] * copies
    level = min(_level(groups, ranks, t, need) for groups in _groupings(ends) if len(groups) <= ranks)
    return level / copies * (1 - _EPS)  # the slack keeps a split that reaches the level within rounding


def _groupings(items: list[float]) -> set[tuple[float, ...]]:
    """The sums of each way to put ``items`` on ranks (a set partition), as sorted tuples."""
    if not items:
        return {()}
    first, rest = items[0], items[1:]
    out = set()
    for g in _groupings(rest):
        out.add(tuple(sorted((first,) + g)))  # alone on a rank
        for i in range(len(g)):  # with the others on one of theirs
            out.add(tuple(sorted(g[:i] + (g[i] + first,) + g[i + 1:])))
    return out


def _level(groups: tuple[float, ...], ranks: int, t: float, need: int) -> float:
    """The least level (work per micro-batch of one copy) at which ``ranks`` hold ``need`` blocks of ``t``
    with the ends ``groups`` on ranks of their own: the busiest rank's work is at least this."""
    top = max(groups, default=0.0)

    def holds(level: float) -> bool:
        if level < top * (1 - _EPS):
            return False
        free = (ranks - len(groups)) * int(level / t + _EPS)
        return free + sum(int((level - g) / t + _EPS) for g in groups) >= need

    best = float("inf")
    for base in {0.0, *groups}:  # the least level is a base plus whole blocks
        lo, hi = max(0, math.ceil((top - base) / t - _EPS)), need
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if holds(base + mid * t) else (mid + 1, hi)
        if holds(base + lo * t):
            best = min(best, base + lo * t)
    return best
