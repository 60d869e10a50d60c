"""How far a prediction may be off, which candidates it cannot tell apart, and what moves it most.

A cluster plan's band is the hardware file's ``band``: the largest relative error of
the published rows the planner is checked against (benchmarks/bench_published.py
prints it, and how many rows it covers when each row is left out). A local plan's band
is the profile's measured spread: each layer's relative half-range over its timed
repeats (``LayerProfile.spread``), weighted by the layer's share of the work. Two
candidates whose bands overlap are a tie: the planner cannot say which is faster.

What moves a cluster plan's step most is ``cluster.sensitivity``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: a local plan's memory band: the worst error of the runtime's measured peak activation bytes per rank against
#: the simulator's prediction fed the profile's per-op bytes (benchmarks/bench_activation_memory.py: 1F1B, GPipe,
#: ZB-H2, ZB-V, V-Half, V-Min on 4 ranks, worst 5.4%); the weights and optimizer state are counted exactly
LOCAL_MEMORY_BAND = 0.054


def memory_cell(nbytes: float, band: float | None) -> str:
    """A memory cell with its band: '39.9 GiB (37.7-42.1)' (no band: the bytes alone)."""
    from .devices import fmt_bytes

    if band is None:
        return fmt_bytes(nbytes)
    return f"{fmt_bytes(nbytes)} ({nbytes * (1 - band) / 2**30:.3g}-{nbytes * (1 + band) / 2**30:.3g})"


def interval(step: float, band: float | None) -> tuple[float, float]:
    """(fastest, slowest) step a relative ``band`` allows; the step itself when the band is unknown."""
    w = band or 0.0
    return step * (1 - w), step * (1 + w)


def tie(a_step: float, a_band: float | None, b_step: float, b_band: float | None) -> bool:
    """Whether the two bands overlap (equal predictions always do)."""
    lo_a, hi_a = interval(a_step, a_band)
    lo_b, hi_b = interval(b_step, b_band)
    return lo_b <= hi_a * (1 + 1e-12) and lo_a <= hi_b * (1 + 1e-12)


def tied_with_first(cands, step=lambda c: c.step_time, band=lambda c: c.band) -> int:
    """How many of the ranked ``cands`` (the first included) tie with the first."""
    if not cands:
        return 0
    first = cands[0]
    return sum(tie(step(first), band(first), step(c), band(c)) for c in cands)


def profile_band(profile, mbs: int) -> float | None:
    """The profile's measured spread at micro-batch size ``mbs``, weighted by each layer's F + B time; None
    when the profile recorded none (made before spreads were measured)."""
    k = profile.size_index(mbs)
    layers = profile.layers
    if not layers or any(len(x.spread) != len(profile.micro_batch_sizes) for x in layers):
        return None
    work = [x.t_f[k] + x.t_b[k] for x in layers]
    total = sum(work)
    return sum(w * x.spread[k] for w, x in zip(work, layers)) / total if total > 0 else 0.0


# ---- one recommendation when bands overlap

#: upper ends of bands closer than this (relative) are equal on the rule's first key: the planner's own
#: resolution (a long step is extended from shorter ones within 1%, ``steady``)
RESOLUTION = 0.01
#: the rule, as ``plan --help`` and the plan say it
RULE = ("when bands overlap, the planner still recommends one of the listed rows (--top) that tie with the "
        "fastest: the best upper end of the band (the slowest step it allows; within 1% is equal), then the most "
        "memory headroom, then fewer pipeline ranks, then fewer micro-batches; a recommendation that leaves less "
        "headroom than the memory reserve says so and names the fastest tied row that leaves more")


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The row the rule picks among the ones that tie with the fastest, and why."""

    row: object  #: the recommended candidate
    tied: int  #: rows (the fastest included) whose bands overlap the fastest's
    decided_by: str  #: the rule's key that picked it over the fastest ("fastest" when it is the fastest)
    tight: bool  #: its headroom is below the reserve: said beside it
    roomy: object | None = None  #: when tight: the fastest tied row whose headroom is at least the reserve


def recommend(rows, reserve: float) -> Recommendation:
    """``RULE`` over ranked cluster rows (fastest first, each with ``step_time``, ``band``, ``headroom`` and a
    ``config`` with ``p`` and ``m``); ``reserve``: the bytes the memory reserve keeps free per GPU.

    Example:
        >>> from types import SimpleNamespace as R
        >>> a = R(step_time=1.0, band=0.1, headroom=1e8, config=R(p=4, m=8))
        >>> b = R(step_time=1.005, band=0.1, headroom=9e9, config=R(p=4, m=8))
        >>> c = R(step_time=1.2, band=0.1, headroom=9e9, config=R(p=2, m=8))
        >>> got = recommend([a, b, c], reserve=2e9)
        >>> got.row is b, got.decided_by, got.tied
        (True, 'more headroom', 3)
    """
    first = rows[0]
    tied = [c for c in rows if tie(first.step_time, first.band, c.step_time, c.band)]
    upper = {id(c): interval(c.step_time, c.band)[1] for c in tied}
    best_upper = min(upper.values())
    near = [c for c in tied if upper[id(c)] <= best_upper * (1 + RESOLUTION)]
    pick = min(near, key=lambda c: (-c.headroom, c.config.p, c.config.m, upper[id(c)]))
    if pick is first:
        why = "fastest"
    elif first not in near:
        why = "the best upper end of the band"
    elif pick.headroom > first.headroom:
        why = "more headroom"
    else:
        why = "fewer pipeline ranks" if pick.config.p < first.config.p else "fewer micro-batches"
    tight = pick.headroom < reserve
    roomy = next((c for c in tied if c.headroom >= reserve), None) if tight else None
    return Recommendation(row=pick, tied=len(tied), decided_by=why, tight=tight, roomy=roomy)
