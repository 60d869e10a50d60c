"""Per-step work outside the profiled layers: loss, optimizer bookkeeping, collectives, launching ops.

The layer profile times each layer alone; a real step also runs the executor's
dispatch of every action, the loss all-reduce, the gather of op timings and
the rest of the step's bookkeeping; and the layers themselves run slower in a
run than timed alone (ranks and their communication threads share the cores and
caches). ``profiling.step_overhead.measure_overhead`` runs the runtime on two local ranks (1F1B at two
micro-batch counts) and takes from the measured timelines ``slowdown``, how much
longer a rank's ops take than the profile says (mean op seconds per rank,
measured / predicted - 1); it then subtracts the planner's prediction with the
makespan so stretched and fits the residual to ``fixed + per_action x actions
per rank``. The profile keeps the fit in ``meta["step_overhead"]`` (a missing
field is 0); ``step_overhead`` (no torch) is what the planner adds.
"""

from __future__ import annotations

from typing import Sequence

KEY = "step_overhead"


def step_overhead(profile, actions: int, makespan: float = 0.0) -> float:
    """Seconds a step spends beyond the layers' profile with ``actions`` ops on the busiest rank and a
    simulated ``makespan``: ``fixed + per_action x actions + slowdown x makespan``.

    >>> from types import SimpleNamespace as P
    >>> step_overhead(P(meta={KEY: {"fixed_s": 0.01, "per_action_s": 0.001, "slowdown": 0.1}}), 10, 0.5)
    0.07
    """
    fit = profile.meta.get(KEY) if profile is not None else None
    if not fit:
        return 0.0
    return fit.get("fixed_s", 0.0) + fit.get("per_action_s", 0.0) * actions + fit.get("slowdown", 0.0) * makespan


def fit_overhead(samples: Sequence[tuple[int, float]]) -> dict:
    """Least squares ``fixed + per_action x actions`` through (actions, residual seconds), both terms >= 0."""
    ns, rs = [float(n) for n, _ in samples], [r for _, r in samples]
    k = len(samples)
    mean_n, mean_r = sum(ns) / k, sum(rs) / k
    var = sum((n - mean_n) ** 2 for n in ns)
    per = sum((n - mean_n) * (r - mean_r) for n, r in zip(ns, rs)) / var if var else 0.0
    fixed = mean_r - per * mean_n
    if per < 0:  # a residual that falls with more actions: a constant is the best non-negative fit
        per, fixed = 0.0, mean_r
    elif fixed < 0:  # through the origin instead
        per, fixed = max(0.0, sum(n * r for n, r in zip(ns, rs)) / sum(n * n for n in ns)), 0.0
    return {"fixed_s": max(0.0, fixed), "per_action_s": per, "samples": [list(s) for s in samples]}


def fit_slowdown(busy: Sequence[tuple[float, float]]) -> float:
    """``measured / predicted - 1`` of a rank's op seconds, summed over (predicted, measured) pairs; >= 0."""
    pred = sum(p for p, _ in busy)
    meas = sum(m for _, m in busy if m is not None)
    if pred <= 0 or any(m is None for _, m in busy):
        return 0.0
    return max(0.0, meas / pred - 1)
