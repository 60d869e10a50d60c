"""`plan --auto`: search an `auto` order for the best one-stage-per-rank configurations."""

from __future__ import annotations

from dataclasses import replace

from ...simulate import simulate
from ...timeline import metrics
from .auto import auto_schedule
from ..search import holding
from ..search import rank_fixed_bytes, rank_transient_bytes, stage_costs
from ..search import Candidate, Config, Searcher, rank


def refine(searcher: Searcher, cands: list[Candidate], top: int = 5) -> list[Candidate]:
    """Add an `auto` candidate for each of the ``top`` distinct fitting configurations with one
    stage per rank and p > 1 (same p, dp, m, micro-batch size, recomputation and split)."""
    seen, added = set(), []
    for c in cands:
        g = c.config
        key = (g.p, g.dp, g.m, g.mbs, g.recompute, c.counts)
        if not c.fits or g.v != 1 or g.p == 1 or c.schedule.stages != g.p or key in seen:
            continue
        seen.add(key)
        added.append(_auto_candidate(searcher, c))
        if len(seen) == top:
            break
    return rank(cands + [a for a in added if a is not None])


def _auto_candidate(s: Searcher, c: Candidate) -> Candidate | None:
    g, prof, cl = c.config, s.profile, s.cluster
    h = holding(c.schedule)
    costs = stage_costs(prof, c.counts, h, g.mbs, g.recompute, cl, g.p, g.dp)
    fixed = rank_fixed_bytes(prof, c.counts, h, cl.state_factor)
    transient = rank_transient_bytes(prof, c.counts, h, g.mbs, g.recompute)
    cap = None if cl.memory is None else [cl.memory - f - t for f, t in zip(fixed, transient)]
    try:
        res = auto_schedule(g.p, g.m, costs, cap, unit_bytes=True)
    except ValueError:
        return None
    mt = metrics(simulate(res.schedule, costs))
    memory = tuple(f + a + t for f, a, t in zip(fixed, mt.peak_activation_bytes, transient))
    step = mt.makespan + c.allreduce + c.optimizer
    return replace(c, config=Config(family="auto", p=g.p, dp=g.dp, v=1, m=g.m, mbs=g.mbs, recompute=g.recompute),
                   step_time=step, makespan=mt.makespan, throughput=s.global_batch / step, bubble=mt.bubble_fraction,
                   memory=memory, activations=mt.peak_activation_bytes,
                   fits=cl.memory is None or max(memory) <= cl.memory * (1 + 1e-9),
                   schedule=res.schedule)
