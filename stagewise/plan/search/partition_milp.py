"""Exact partition when ranks hold several pieces: a mixed-integer program solved by HiGHS.

The unknowns are the cut positions ``c_1 < ... < c_{S-1}`` (piece k holds
layers ``[c_k, c_{k+1})``). Layers come in *runs* of identical ones (a GPT is
E, t*32, H: three runs), and within a run every prefix sum is linear in the
position, so each cut is one binary per run (which run it falls in) plus an
integer offset: (S-1) x runs binaries, not layers x pieces. A model whose
layers all differ has one run per layer and the same program stays exact.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import PlanError
from ..highs import highspy_module, linear, quiet_highs
from .holding import Holding
from .layer_costs import LayerCosts, runs_of


class _Cuts:
    """Cut variables and the prefix sums they select (linear within a run)."""

    def __init__(self, hs, lc: LayerCosts, S: int):
        self.hs, self.lc, self.S, self.L = hs, lc, S, len(lc.time)
        self.runs = runs_of(lc)
        self.bin = [[hs.addBinary() for _ in self.runs] for _ in range(S - 1)]
        self.off = [[hs.addIntegral(lb=0, ub=e - s - 1) for s, e in self.runs] for _ in range(S - 1)]
        for k in range(S - 1):
            hs.addConstr(linear(self.bin[k]) == 1)
            for j, (s, e) in enumerate(self.runs):
                hs.addConstr(self.off[k][j] <= (e - s - 1) * self.bin[k][j])
        for k in range(S):  # every piece non-empty
            hs.addConstr(self.cut(k + 1) - self.cut(k) >= 1)

    def cut(self, k: int):
        if k == 0:
            return 0.0
        if k == self.S:
            return float(self.L)
        return linear(s * b + o for (s, _), b, o in zip(self.runs, self.bin[k - 1], self.off[k - 1]))

    def prefix(self, values, k: int):
        """sum(values[:c_k]) as a linear expression (values constant within each run)."""
        if k == 0:
            return 0.0
        if k == self.S:
            return float(sum(values))
        terms = []
        for (s, _), b, o in zip(self.runs, self.bin[k - 1], self.off[k - 1]):
            before = float(sum(values[:s]))
            terms += [before * b, values[s] * o]
        return linear(terms)

    def piece(self, values, k: int):
        return linear([self.prefix(values, k + 1), -1.0 * self.prefix(values, k)])

    def at_cut(self, values, k: int):
        """values[c_k]: the first layer of piece k (constant within a run)."""
        if k == 0:
            return float(values[0])
        return linear(values[s] * b for (s, _), b in zip(self.runs, self.bin[k - 1]))

    def counts(self) -> tuple[int, ...]:
        cuts = [0] + [round(sum(s * self.hs.val(b) + self.hs.val(o)
                                for (s, _), b, o in zip(self.runs, self.bin[k - 1], self.off[k - 1])))
                      for k in range(1, self.S)] + [self.L]
        return tuple(int(b - a) for a, b in zip(cuts, cuts[1:]))


def solve(lc: LayerCosts, h: Holding, limit: float | None):
    """Layers per piece minimising the slowest rank, ties to the most even pieces.

    Returns None when no split fits ``limit``.
    """
    highspy = highspy_module("partitioning for ranks that hold several stages")
    hs = quiet_highs(highspy)
    hs.setOptionValue("mip_rel_gap", 0.0)
    S = h.pieces
    top = max(lc.time) or 1.0  # times scaled to ~1 so the solver's absolute tolerances are small
    lc = replace(lc, time=tuple(t / top for t in lc.time))
    cuts = _Cuts(hs, lc, S)
    T = hs.addVariable(lb=0.0)
    for r in range(h.ranks):
        stages = h.rank_stages[r]
        hs.addConstr(linear(h.stage_share[s] * cuts.piece(lc.time, h.stage_piece[s]) for s in stages) <= T)
        if limit is not None:
            _memory_rows(hs, cuts, lc, h, r, limit)
    ok = highspy.HighsModelStatus.kOptimal
    hs.minimize(T)
    if hs.getModelStatus() != ok:
        return None
    first = cuts.counts()
    # second pass at the optimum: the most even pieces (least spread between largest and smallest);
    # ties of the slowest rank are many, and even pieces keep a pipeline flowing
    hs.addConstr(T <= hs.val(T) * (1 + 1e-6) + 1e-7)  # the solver's tolerances, not a trade-off
    hi, lo = hs.addVariable(lb=0.0), hs.addVariable(lb=0.0)
    for k in range(S):
        piece = cuts.piece(lc.time, k)
        hs.addConstr(piece <= hi)
        hs.addConstr(piece >= lo)
    hs.minimize(hi - lo)
    if hs.getModelStatus() != ok:
        return first  # tolerances kept the second pass from the first's optimum: keep that one
    return cuts.counts()


def _memory_rows(hs, cuts: _Cuts, lc: LayerCosts, h: Holding, r: int, limit: float) -> None:
    """Rank r's bytes at each of its possible peaks stay within ``limit``."""
    pieces = [h.stage_piece[s] for s in h.rank_stages[r]]
    fixed = linear(cuts.piece(lc.fixed, k) for k in pieces)
    extra = 0.0
    if lc.input_bytes is not None:  # one micro-batch's full activations rebuilt in a backward
        extra = hs.addVariable(lb=0.0)
        for k in pieces:
            hs.addConstr(cuts.piece(lc.act, k) <= extra)
    kept = {k: cuts.at_cut(lc.input_bytes, k) if lc.input_bytes else cuts.piece(lc.act, k) for k in pieces}
    for vec in h.live[r]:
        act = linear(n * kept[k] for n, k in zip(vec, pieces) if n)
        hs.addConstr(fixed + act + extra <= limit * (1 + 1e-9))
