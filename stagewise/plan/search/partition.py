"""Exact partition of a model's layers into contiguous pieces under a memory limit.

The objective is the slowest *rank*: a rank that holds several pieces
(interleaved, V-shape, DualPipe) runs them all, so their times add up. Memory
per rank is its fixed bytes (parameters, gradients, optimizer state) plus the
activations live at its worst moment of the schedule (``Holding.live``), plus,
with recomputation, one micro-batch's full activations rebuilt in a backward.

- One piece per rank: dynamic programming over (piece, layers used), exact,
  O(pieces * layers^2); ties go to the split with the most even piece times.
- Several pieces per rank: a mixed-integer program (HiGHS), exact.

When no split fits the limit, the fastest split is returned with ``fits=False``
(its memory says how far off the limit is).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import accumulate

from ..errors import PlanError
from .holding import Holding
from .layer_costs import LayerCosts, runs_of

_EPS = 1e-9


#: how a search splits the layers: "balanced" (the partitioner's fastest split that fits) or "even" (the
#: frameworks' default with no layout flags: ``even_split``)
SPLITS = ("balanced", "even")


def even_split(symbols: tuple[str, ...], stages: int) -> tuple[int, ...] | None:
    """Megatron-LM's split when no layout is given (``--num-layers`` / (p x v) blocks a stage, torchtitan's
    too): the blocks divided equally over ``stages``, the embedding ("E") with the first and the head ("H")
    with the last. None when the stages do not divide the blocks (Megatron-LM refuses that layout).

    >>> even_split(("E",) + ("t",) * 8 + ("H",), 4)
    (3, 2, 2, 3)
    >>> even_split(("E",) + ("t",) * 6 + ("H",), 4) is None
    True
    """
    ends = int(symbols[:1] == ("E",)), int(symbols[-1:] == ("H",))
    blocks = len(symbols) - sum(ends)
    if stages < 1 or blocks % stages or blocks < stages:
        return None
    counts = [blocks // stages] * stages
    counts[0] += ends[0]
    counts[-1] += ends[1]
    return tuple(counts)


class PartitionError(PlanError):
    """More pieces than layers, or another split that cannot exist."""


@dataclass(frozen=True, kw_only=True)
class Partition:
    """Layers per piece and what they cost per rank."""

    counts: tuple[int, ...]
    rank_time: tuple[float, ...]  #: work per micro-batch-step on each rank (shares applied)
    rank_memory: tuple[float, ...]  #: bytes at the worst moment on each rank
    fits: bool

    @property
    def bottleneck(self) -> float:
        return max(self.rank_time)

    def _replace_fits(self, limit: float | None) -> "Partition":
        fits = limit is None or max(self.rank_memory) <= limit * (1 + _EPS)
        return Partition(counts=self.counts, rank_time=self.rank_time, rank_memory=self.rank_memory, fits=fits)


class _Sums:
    """Interval sums [i, j) of the per-layer lists in O(1)."""

    def __init__(self, lc: LayerCosts):
        self.lc = lc
        self._t, self._f, self._a = (list(accumulate(x, initial=0.0)) for x in (lc.time, lc.fixed, lc.act))

    def time(self, i: int, j: int) -> float:
        return self._t[j] - self._t[i]

    def fixed(self, i: int, j: int) -> float:
        return self._f[j] - self._f[i]

    def full_act(self, i: int, j: int) -> float:
        return self._a[j] - self._a[i]

    def kept_act(self, i: int, j: int) -> float:
        return self.lc.input_bytes[i] if self.lc.input_bytes is not None else self.full_act(i, j)


def evaluate(lc: LayerCosts, h: Holding, counts, memory_limit: float | None = None) -> Partition:
    """Time and memory per rank of a given split (``counts`` layers per piece)."""
    if len(counts) != h.pieces or sum(counts) != len(lc.time) or min(counts) < 1:
        raise PartitionError(f"split {list(counts)} does not cut {len(lc.time)} layers into {h.pieces} "
                             "non-empty pieces")
    sums = _Sums(lc)
    bounds = [0, *accumulate(counts)]
    piece = [(bounds[k], bounds[k + 1]) for k in range(h.pieces)]
    times, mems = [], []
    for r in range(h.ranks):
        stages = h.rank_stages[r]
        times.append(sum(h.stage_share[s] * sums.time(*piece[h.stage_piece[s]]) for s in stages))
        mems.append(_rank_memory(sums, h, r, [piece[h.stage_piece[s]] for s in stages]))
    fits = memory_limit is None or max(mems) <= memory_limit * (1 + _EPS)
    return Partition(counts=tuple(counts), rank_time=tuple(times), rank_memory=tuple(mems), fits=fits)


def _rank_memory(sums: _Sums, h: Holding, r: int, spans) -> float:
    fixed = sum(sums.fixed(i, j) for i, j in spans)
    kept = [sums.kept_act(i, j) for i, j in spans]
    act = max((sum(n * a for n, a in zip(vec, kept)) for vec in h.live[r]), default=0.0)
    transient = max((sums.full_act(i, j) for i, j in spans), default=0.0) if sums.lc.input_bytes else 0.0
    return fixed + act + transient


def partition(lc: LayerCosts, h: Holding, memory_limit: float | None = None) -> Partition:
    """The split with the fastest slowest rank that fits ``memory_limit`` bytes per rank.

    If none fits, the fastest split regardless of memory, with ``fits=False``.
    """
    counts = best_split(lc, h, memory_limit)
    if counts is None:  # nothing fits: the fastest split, marked as not fitting
        counts = best_split(lc, h, None)
    return evaluate(lc, h, counts, memory_limit)


def best_split(lc: LayerCosts, h: Holding, memory_limit: float | None) -> tuple[int, ...] | None:
    """Layers per piece of the exact optimum, or None when no split fits ``memory_limit``."""
    L = len(lc.time)
    if h.pieces > L:
        raise PartitionError(f"{h.pieces} stages need at least {h.pieces} layers; the model has {L}")
    if memory_limit is not None and memory_floor(lc, h) > memory_limit * (1 + _EPS):
        return None  # proven without a search: no split fits
    if h.one_stage_per_rank:
        return _dp(lc, h, memory_limit)
    if memory_limit is None:
        counts = _waterfill(lc, h)
        if counts is not None:
            return counts
    from .partition_milp import solve

    return solve(lc, h, memory_limit)


def _waterfill(lc: LayerCosts, h: Holding) -> tuple[int, ...] | None:
    """Exact split, no memory limit, for the common model shape ``[E] t*n [H]`` (identical
    blocks between an optional first and last layer) when each piece runs on one rank.

    Piece k then holds n_k blocks (plus E or H), every count is free above its minimum,
    and a rank's time is its ends' time plus t times its blocks: filling the least loaded
    rank one block at a time is optimal. None when the shape does not apply.
    """
    runs = runs_of(lc)
    S, L = h.pieces, len(lc.time)
    if len(h.stage_piece) != S or any(x != 1.0 for x in h.stage_share) or len(runs) > 3:
        return None
    head = runs[0] == (0, 1) and len(runs) > 1
    tail = runs[-1] == (L - 1, L) and len(runs) > 1
    if len(runs) - head - tail != 1:
        return None
    t = lc.time[1 if head else 0]
    extra = [0.0] * S
    extra[0] += lc.time[0] if head else 0.0
    extra[-1] += lc.time[-1] if tail else 0.0
    low = [0 if (k == 0 and head) or (k == S - 1 and tail) else 1 for k in range(S)]
    blocks = L - head - tail
    rank_of = {h.stage_piece[s]: h.stage_rank[s] for s in range(S)}
    pieces_of: dict[int, list[int]] = {}
    for k in range(S):
        pieces_of.setdefault(rank_of[k], []).append(k)
    load = {r: sum(extra[k] + t * low[k] for k in ks) for r, ks in pieces_of.items()}
    extra_blocks = {r: 0 for r in pieces_of}
    heap = [(v, r) for r, v in load.items()]
    heapq.heapify(heap)
    for _ in range(blocks - sum(low)):  # the least loaded rank takes the next block
        v, r = heapq.heappop(heap)
        extra_blocks[r] += 1
        heapq.heappush(heap, (v + t, r))
    n = list(low)
    for r, ks in pieces_of.items():  # within a rank, the lightest piece takes the next block
        inner = [(extra[k] + t * n[k], k) for k in ks]
        heapq.heapify(inner)
        for _ in range(extra_blocks[r]):
            v, k = heapq.heappop(inner)
            n[k] += 1
            heapq.heappush(inner, (v + t, k))
    return tuple(n[k] + (k == 0 and head) + (k == S - 1 and tail) for k in range(S))


def memory_floor(lc: LayerCosts, h: Holding) -> float:
    """A lower bound on the largest rank memory of any split: the average over ranks.

    Every layer's fixed bytes are held once per copy, and each piece keeps at least
    ``c_k`` of its activations at its rank's fullest moment (c_k from that moment's
    live counts), each at least the smallest per-layer activation kept.
    """
    copies = len(h.stage_piece) / h.pieces
    fixed = sum(lc.fixed) * copies
    kept = min(lc.input_bytes) if lc.input_bytes is not None else min(lc.act)
    live = sum(max(sum(v) for v in vecs) for vecs in h.live if vecs)
    return (fixed + live * kept) / h.ranks


def _dp(lc: LayerCosts, h: Holding, limit: float | None):
    """Exact split for one piece per rank: min of the max cost, then the most even times."""
    sums = _Sums(lc)
    rank_of = {h.stage_piece[s]: h.stage_rank[s] for s in range(len(h.stage_piece))}
    share = {h.stage_piece[s]: h.stage_share[s] for s in range(len(h.stage_piece))}

    def mem(k: int, i: int, j: int) -> float:
        return _rank_memory(sums, h, rank_of[k], [(i, j)])

    def cost(k: int, i: int, j: int) -> float:
        return share[k] * sums.time(i, j)

    fits = None
    if limit is not None:
        def fits(k: int, i: int, j: int) -> bool:
            return mem(k, i, j) <= limit * (1 + _EPS)

    best = _minmax(len(lc.time), h.pieces, cost, fits)
    if best is None:
        return None
    # second pass: among splits within the optimum, the most even (least sum of squares)
    cap = best * (1 + _EPS) + _EPS

    def even_fits(k: int, i: int, j: int) -> bool:
        return cost(k, i, j) <= cap and (fits is None or fits(k, i, j))

    return _min_sumsq(len(lc.time), h.pieces, cost, even_fits)


def _minmax(L: int, S: int, cost, fits) -> float | None:
    """min over splits of [0, L) into S non-empty pieces of the max piece cost."""
    inf = float("inf")
    f = [0.0] + [inf] * L  # f[j]: best over the first k pieces covering [0, j)
    for k in range(S):
        g = [inf] * (L + 1)
        for j in range(k + 1, L - (S - k - 1) + 1):
            for i in range(k, j):
                if f[i] == inf or (fits is not None and not fits(k, i, j)):
                    continue
                c = cost(k, i, j)
                v = f[i] if f[i] > c else c
                if v < g[j]:
                    g[j] = v
        f = g
    return None if f[L] == inf else f[L]


def _min_sumsq(L: int, S: int, cost, fits) -> tuple[int, ...] | None:
    inf = float("inf")
    f = [0.0] + [inf] * L
    back: list[list[int]] = []
    for k in range(S):
        g, arg = [inf] * (L + 1), [-1] * (L + 1)
        for j in range(k + 1, L - (S - k - 1) + 1):
            for i in range(k, j):
                if f[i] == inf or not fits(k, i, j):
                    continue
                v = f[i] + cost(k, i, j) ** 2
                if v < g[j]:
                    g[j], arg[j] = v, i
        f = g
        back.append(arg)
    if f[L] == inf:
        return None
    cuts, j = [L], L
    for k in range(S - 1, -1, -1):
        j = back[k][j]
        cuts.append(j)
    cuts.reverse()
    return tuple(b - a for a, b in zip(cuts, cuts[1:]))
