"""Closed forms from the literature, to check the simulator against.

Each family's forms live with it in the registry (``Family.idle``,
``Family.pairs``, ``Family.memory``; the functions are in
``schedules/forms.py``); this module turns costs into the uniform durations
they take and the idle time into a bubble. All assume uniform per-stage costs
and free links, and a form is given only where the simulator confirms it
exactly (tests/test_formulas.py sweeps these conditions); it is ``None``
elsewhere, or where the literature has none for a shared step end (ZB-H2 and
ZB-V are "zero bubble" only with the step-end synchronisation dropped).

Notation: p ranks, m micro-batches, v stages per rank; F, B (full backward =
I + W), W (weight part), F&B an overlapped pair; costs are per stage. Idle is
the largest idle time of a rank, makespan - busy. With k sequence slices
(Seq1F1B) m micro-batches run as m k units of 1/k of the costs each.
"""

from __future__ import annotations

from .costs import Costs
from .all_to_all import pair_time
from .schedules.forms import Uniform
from .schedules.registry import FAMILIES


def uniform(costs: Costs) -> Uniform | None:
    """The durations when every stage costs the same and links are free (else None).

    A plain action's duration includes its all-to-all; an F&B pair's is derived (``overlap.pair_time``)
    unless ``t_fb`` sets it.
    """
    vals = [costs.t_f, costs.t_b, costs.t_i, costs.t_w, costs.t_fb, costs.a2a, costs.a2a_b]
    if any(v is not None and not isinstance(v, (int, float)) for v in vals):
        return None
    if costs.latency or (costs.bandwidth and costs.boundary_bytes) or costs.recompute is not False:
        return None
    f, b = float(costs.t_f), float(costs.t_b)
    w = float(costs.t_w) if costs.t_w is not None else b / 2
    i = float(costs.t_i) if costs.t_i is not None else b / 2
    a_f = float(costs.a2a)
    a_b = float(costs.a2a_b) if costs.a2a_b is not None else a_f
    fb = float(costs.t_fb) if costs.t_fb is not None else pair_time(f, a_f, b, a_b, min(i, b))
    if abs(i + w - b) > 1e-12 * max(1.0, b):
        return None  # split and full backward would cost different amounts
    return Uniform(f=f + a_f, b=b + a_b, i=i + a_b, w=w, fb=fb)


def idle_per_rank(name: str, p: int, m: int, v: int, costs: Costs, slices: int = 1) -> float | None:
    """Idle time per rank predicted by the papers (None where there is no exact closed form); ``m`` micro-batches
    cut into ``slices`` units each."""
    fam, u = FAMILIES.get(name), uniform(costs)
    if fam is None or fam.idle is None or u is None:
        return None
    return fam.idle(p, m, v, u, slices) if fam.slices else fam.idle(p, m, v, u) if slices == 1 else None


def overlapped_pairs(name: str, p: int, m: int) -> list[int]:
    """F&B pairs in each rank's program (DualPipe's steps 4 and 5; 0 elsewhere)."""
    fam = FAMILIES.get(name)
    return fam.pairs(p, m) if fam is not None and fam.pairs is not None else [0] * p


def busy_per_rank(name: str, p: int, m: int, v: int, costs: Costs) -> list[float] | None:
    """Compute time of each rank: its stage-visits times F + B, less what the F&B pairs save."""
    u = uniform(costs)
    if u is None:
        return None
    copies = FAMILIES[name].param_copies if name in FAMILIES else 1
    visits = m * v // copies  # each model copy (lane) is fed m / copies micro-batches
    return [visits * (u.f + u.b) - k * (u.f + u.b - u.fb) for k in overlapped_pairs(name, p, m)]


def bubble_fraction(name: str, p: int, m: int, v: int, costs: Costs | None = None, slices: int = 1) -> float | None:
    """Idle share 1 - busy / (p * makespan) implied by the closed form (``m`` micro-batches of ``slices`` units)."""
    costs = costs or Costs()
    idle = idle_per_rank(name, p, m, v, costs, slices)
    busy = busy_per_rank(name, p, m, v, costs)
    if idle is None or busy is None:
        return None
    makespan = min(busy) + idle  # the least busy rank idles the most
    return 1.0 - sum(busy) / (p * makespan) if makespan > 0 else 0.0
