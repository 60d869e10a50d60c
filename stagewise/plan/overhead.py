"""Per-step work outside the profiled layers: loss, optimizer bookkeeping, collectives, launching ops.

The layer profile times each layer alone; a real step also runs the executor's
dispatch of every action, the loss all-reduce, the gather of op timings and
the rest of the step's bookkeeping. ``measure_overhead`` runs the runtime on two
local ranks (1F1B at two micro-batch counts), subtracts the planner's own
prediction for the same configurations, and fits the residual to
``fixed + per_action x actions per rank``. The profile keeps the fit in
``meta["step_overhead"]``; ``step_overhead`` (no torch) is what the planner adds.
"""

from __future__ import annotations

from typing import Callable, Sequence

KEY = "step_overhead"


def step_overhead(profile, actions: int) -> float:
    """Seconds a step spends outside the profiled layers with ``actions`` ops on the busiest rank."""
    fit = profile.meta.get(KEY) if profile is not None else None
    if not fit:
        return 0.0
    return fit["fixed_s"] + fit["per_action_s"] * actions


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


def measure_overhead(profile, microbatches: Sequence[int] = (2, 8), *, steps: int = 6, rounds: int = 2,
                     log: Callable[[str], None] | None = None) -> dict:
    """Run 1F1B on two local ranks at each micro-batch count and fit what the layers do not explain."""
    from .cluster import Cluster
    from .search import Searcher, Space, search
    from .verify import verify

    mbs = profile.micro_batch_sizes[0]
    link = profile.link
    cl = Cluster(devices=2, per_node=2, memory=None, intra=link, inter=link)
    cands = []
    for m in microbatches:
        space = Space(families=("1f1b",), micro_batch_sizes=(mbs,), recompute=(False,))
        ranked = search(Searcher(profile=profile, cluster=cl, global_batch=m * mbs, space=space))
        cands.append(next(c for c in ranked if c.config.p == 2))
    rows = verify(profile, cands, len(cands), steps=steps, rounds=rounds, log=log)
    samples = [(max(len(p) for p in c.schedule.programs), row["measured_step"] - row["predicted_step"])
               for c, row in zip(cands, rows)]
    return fit_overhead(samples)
