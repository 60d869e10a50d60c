"""Why a cluster plan's winner wins: one sentence against the best other layout."""

from __future__ import annotations

from ..search import fmt_bytes, fmt_seconds


def cluster_why(ranking, ties: int, rec=None, reserve: float = 0.0) -> str:
    """One line for a cluster plan: the recommended row (``bands.recommend``; the fastest without ``rec``)
    against the best layout of another family (or, if every row is one family, of another t x p), what makes
    the difference, whether the band can tell them apart, and its headroom when it is below the reserve."""
    best = rec.row if rec is not None else ranking[0]
    g = best.config
    def differs(c) -> tuple:
        return (c.config.family != g.family, (c.parallelism.tp, c.config.p) != (best.parallelism.tp, g.p),
                (c.config.v, c.config.mbs, c.recompute, c.sharding) != (g.v, g.mbs, best.recompute, best.sharding))

    other = next((c for level in range(3) for c in ranking if c is not best and differs(c)[level]), None)
    name = f"{g.family} t={best.parallelism.tp} p={g.p} ({best.framework}, {best.sharding})"
    tight = ""
    if rec is not None and rec.tight:
        r = rec.roomy
        alt = (f"the fastest tied row that leaves more is #{ranking.index(r) + 1} ({r.config.family} "
               f"t={r.parallelism.tp} p={r.config.p}, {fmt_seconds(r.step_time)}, {fmt_bytes(r.headroom)} free)" if r is not None else
               "no tied row listed leaves more (a larger --memory-reserve plans with room)")
        tight = (f"; note: it leaves {fmt_bytes(best.headroom)} free beyond the {fmt_bytes(reserve)} memory reserve, "
                 f"less than the reserve itself; {alt}")
    if other is None:
        frameworks = sorted({c.framework for c in ranking})
        return (f"{name} ranks first: the only layout the options leave (costed for {', '.join(frameworks)}); "
                "widen --schedules, --tp or --ranks to compare" + tight)
    o = other.config
    reasons = [f"step {fmt_seconds(best.step_time)} vs {fmt_seconds(other.step_time)}",
               f"bubble {best.candidate.bubble:.1%} vs {other.candidate.bubble:.1%}"]
    work_b = best.candidate.makespan * (1 - best.candidate.bubble)
    work_o = other.candidate.makespan * (1 - other.candidate.bubble)
    if abs(work_b - work_o) > 0.01 * work_o:  # tensor-parallel collectives, recomputation, split backward
        reasons.append(f"compute per GPU {fmt_seconds(work_b)} vs {fmt_seconds(work_o)}")
    exposed_b, exposed_o = best.exposed_dp + best.exposed_gather, other.exposed_dp + other.exposed_gather
    if abs(exposed_b - exposed_o) > 0.01 * best.step_time:
        reasons.append(f"exposed data-parallel traffic {fmt_seconds(exposed_b)} vs {fmt_seconds(exposed_o)}")
    reasons.append(f"headroom {fmt_bytes(best.headroom)} vs {fmt_bytes(other.headroom)}")
    diff = [f"{k}={v}" for k, v, w in (("t", other.parallelism.tp, best.parallelism.tp), ("p", o.p, g.p),
                                       ("v", o.v, g.v), ("mbs", o.mbs, g.mbs), ("rc", other.recompute, best.recompute))
            if v != w]
    where = f"at its best, {', '.join(diff)}" if diff else "same t, p, v, mbs and recomputation"
    beside = f"the best {o.family} (#{ranking.index(other) + 1}, {where}): " + ", ".join(reasons)
    if ties > 1:
        band = f"within the ±{best.band:.1%} band" if best.band else "with the same prediction"
        pick = (f"the fastest, #{ranking.index(best) + 1}" if rec is None or rec.decided_by == "fastest" else
                f"#{ranking.index(best) + 1}, by {rec.decided_by}")
        return (f"{name} is recommended: {ties} rows tie with the fastest {band}, and the rule (plan --help) picks "
                f"{pick}; beside it " + beside + tight)
    faster = other.step_time / best.step_time - 1
    verdict = f"outside the ±{best.band:.1%} band" if best.band is not None else "no band for this hardware"
    return f"{name} ranks first: {faster:.1%} faster than " + beside + f"; {verdict}" + tight
