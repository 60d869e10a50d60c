"""Measure the per-step work outside the profiled layers on the runtime (plan/search/overhead.py fits it).

Runs 1F1B on two local ranks at two micro-batch counts through ``plan --verify``'s runner and hands the
measured timelines to the planner's torch-free fit (``plan.search.overhead.fit_overhead``, ``fit_slowdown``).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..plan.search import Cluster
from ..plan.search import fit_overhead, fit_slowdown
from ..plan.search import Searcher, Space, search
from .verify import verify


def measure_overhead(profile, microbatches: Sequence[int] = (2, 8), *, steps: int = 6, rounds: int = 2,
                     log: Callable[[str], None] | None = None) -> dict:
    """Run 1F1B on two local ranks at each micro-batch count and fit what the layers do not explain."""
    mbs = profile.micro_batch_sizes[0]
    link = profile.link
    cl = Cluster(devices=2, per_node=2, memory=None, intra=link, inter=link)
    cands = []
    for m in microbatches:
        space = Space(families=("1f1b",), micro_batch_sizes=(mbs,), recompute=(False,))
        ranked = search(Searcher(profile=profile, cluster=cl, global_batch=m * mbs, space=space))
        cands.append(next(c for c in ranked if c.config.p == 2))
    rows = verify(profile, cands, len(cands), steps=steps, rounds=rounds, log=log)
    slowdown = fit_slowdown([(c.makespan * (1 - c.bubble), row["measured_busy"]) for c, row in zip(cands, rows)])
    samples = [(max(len(p) for p in c.schedule.programs),
                row["measured_step"] - row["predicted_step"] - slowdown * c.makespan)
               for c, row in zip(cands, rows)]
    return {**fit_overhead(samples), "slowdown": slowdown}
