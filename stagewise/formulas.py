"""Closed forms from the literature, to check the simulator against.

All assume uniform per-stage costs and free links. Each family's form is
given only where the simulator confirms it exactly (tests/test_formulas.py
sweeps these conditions) and is ``None`` elsewhere, or where the literature
has none for a shared step end (ZB-H2 and ZB-V are "zero bubble" only with
the step-end synchronisation dropped):

- GPipe, 1F1B: (p-1)(F+B), any m.
- interleaved 1F1B, looped BFS: (p-1)(F+B) in per-chunk costs, m >= p.
- ZB-H1: (p-1)(F+B-2W), m >= p and W <= min(F, I).
- DualPipe, DualPipeV: (PP/2-1)(F&B+B-3W), PP = stages of one model copy
  (p, and 2p for the V), when F = I = W and B <= F&B <= F + B.

Notation: p ranks, m micro-batches, v stages per rank; F, B (full backward =
I + W), W (weight part), F&B an overlapped pair; costs are per stage. Idle is
the largest idle time of a rank, makespan - busy.
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
    if abs(i + w - b) > 1e-12 * max(1.0, b):
        return None  # split and full backward would cost different amounts
    return f, b, i, w, fb


def idle_per_rank(name: str, p: int, m: int, v: int, costs: Costs) -> float | None:
    """Idle time per rank predicted by the papers (None where there is no exact closed form)."""
    u = _uniform(costs)
    if u is None:
        return None
    f, b, i, w, fb = u
    if name in ("gpipe", "1f1b"):
        return (p - 1) * (f + b)  # GPipe / PipeDream-flush, any m
    if name in ("interleaved-1f1b", "looped-bfs") and m >= p:
        # Narayanan et al. 2021: per-chunk costs, so 1/v of a 1F1B stage's bubble
        return (p - 1) * (f + b)
    if name == "zb-h1" and m >= p and w <= min(f, i):
        return (p - 1) * (f + b - 2 * w)  # Qi et al. 2024, DualPipe README's ZB1P row
    if name in ("dualpipe", "dualpipe-v") and f == i == w and b <= fb <= f + b:
        stages = 2 * p if name == "dualpipe-v" else p  # PP: DualPipeV is DualPipe on 2p ranks, halved
        return (stages / 2 - 1) * (fb + b - 3 * w)  # DeepSeek-V3 DualPipe table
    return None


def overlapped_pairs(name: str, p: int, m: int) -> list[int]:
    """F&B pairs in each rank's program (DualPipe's steps 4 and 5; 0 elsewhere)."""
    if name not in ("dualpipe", "dualpipe-v"):
        return [0] * p
    H, n = (p // 2, m // 2) if name == "dualpipe" else (p, m)
    pairs = []
    for r in range(p):
        h = min(r, p - 1 - r) if name == "dualpipe" else r
        step_4, step_5 = n - 2 * H + h + 1, H - h - 1
        pairs.append(2 * step_4 - (h == H - 1) + step_5)
    return pairs


def busy_per_rank(name: str, p: int, m: int, v: int, costs: Costs) -> list[float] | None:
    """Compute time of each rank: its stage-visits times F + B, less what the F&B pairs save."""
    u = _uniform(costs)
    if u is None:
        return None
    f, b, i, w, fb = u
    # DualPipe: two stages per rank, each fed half the micro-batches
    visits = m if name == "dualpipe" else m * v
    return [visits * (f + b) - k * (f + b - fb) for k in overlapped_pairs(name, p, m)]


def bubble_fraction(name: str, p: int, m: int, v: int, costs: Costs | None = None) -> float | None:
    """Idle share 1 - busy / (p * makespan) implied by the closed form."""
    costs = costs or Costs()
    idle = idle_per_rank(name, p, m, v, costs)
    busy = busy_per_rank(name, p, m, v, costs)
    if idle is None or busy is None:
        return None
    makespan = min(busy) + idle  # the least busy rank idles the most
    return 1.0 - sum(busy) / (p * makespan) if makespan > 0 else 0.0
