"""Closed forms from the literature, to check the simulator against.

All assume uniform per-stage costs and free links. ``None`` means the
literature gives no closed form for that family (or those costs).
Notation: p ranks, m micro-batches, v chunks per rank; F, B (full backward),
W (weight part), F&B an overlapped pair; costs are per stage (per chunk).
"""

from __future__ import annotations

from .costs import Costs


def _uniform(costs: Costs):
    vals = [costs.t_f, costs.t_b, costs.t_i, costs.t_w, costs.t_fb]
    if any(v is not None and not isinstance(v, (int, float)) for v in vals):
        return None
    if costs.latency or (costs.bandwidth and costs.boundary_bytes) or costs.recompute is not False:
        return None
    f, b = float(costs.t_f), float(costs.t_b)
    w = float(costs.t_w) if costs.t_w is not None else b / 2
    i = float(costs.t_i) if costs.t_i is not None else b / 2
    fb = float(costs.t_fb) if costs.t_fb is not None else f + b
    return f, b, i, w, fb


def idle_per_rank(name: str, p: int, m: int, v: int, costs: Costs) -> float | None:
    """Idle time per rank predicted by the papers (None where there is no closed form)."""
    u = _uniform(costs)
    if u is None:
        return None
    f, b, i, w, fb = u
    if i + w != b:
        return None
    if name in ("gpipe", "1f1b"):
        return (p - 1) * (f + b)  # GPipe / PipeDream-flush
    if name in ("interleaved-1f1b", "looped-bfs") and m % p == 0:
        return (p - 1) * (f + b)  # per-chunk costs: a 1/v share of a 1f1b stage's bubble
    if name == "zb-h1":
        return (p - 1) * (f + b - 2 * w)  # Qi et al. 2024, DualPipe README's ZB1P row
    if name in ("dualpipe", "dualpipe-v"):
        stages = 2 * p if name == "dualpipe-v" else p  # PP = number of stages
        return (stages / 2 - 1) * (fb + b - 3 * w)  # DeepSeek-V3 DualPipe table
    return None


def bubble_fraction(name: str, p: int, m: int, v: int, costs: Costs | None = None) -> float | None:
    """Idle share 1 - busy / (p * makespan) implied by the closed form."""
    costs = costs or Costs()
    idle = idle_per_rank(name, p, m, v, costs)
    if idle is None:
        return None
    f, b, *_ = _uniform(costs)
    busy = m * v * (f + b)
    return idle / (busy + idle) if busy + idle > 0 else 0.0
