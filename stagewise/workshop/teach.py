"""Teach: the numbers the page's short lesson quotes, simulated at the page's own settings.

The lesson compares the families that each change one thing about the bubble or the memory
(GPipe, 1F1B, interleaving, zero bubble, DualPipe) at the view's p, m and costs, and writes each
closed form with the page's numbers plugged in (``formula``; its value is ``formulas.bubble_fraction``'s,
which tests/test_workshop_teach.py checks).
"""

from __future__ import annotations

from dataclasses import replace

from ..explain import gap_causes, idle_by_cause
from ..formulas import uniform
from .api import Settings, SettingError, available, costs_for, simulate_settings

#: one family per idea: the bubble, memory, interleaving, zero bubble, both ends at once
TAUGHT = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")


def payload(s: Settings) -> dict:
    """Per taught family at the page's p, m and costs (its own v, no cap): bubble, closed form, peak
    memory, idle per cause, or the rule it breaks."""
    rows = []
    for name in TAUGHT:
        if name not in available():
            continue
        try:
            ((tl, res),) = simulate_settings(replace(s, schedules=(name,), v=None, cap=None))
        except SettingError as e:
            rows.append({"schedule": name, "error": str(e)})
            continue
        sched = tl.schedule
        rows.append({"schedule": name, "chunks": res["chunks"], "makespan": res["makespan"],
                     "bubble_fraction": res["bubble_fraction"],
                     "formula_bubble_fraction": res["formula_bubble_fraction"],
                     "peak_activations": res["peak_activations"], "busy": res["busy"],
                     "idle_by_cause": idle_by_cause(gap_causes(tl)),
                     "formula": formula(name, s.p, s.m, res["chunks"], costs_for(s, sched))})
    return {"p": s.p, "m": s.m, "rows": rows}


def formula(name: str, p: int, m: int, v: int, costs) -> dict | None:
    """The family's closed-form bubble as text, with the numbers in, and its value; None where the family
    has none for these costs (uneven stages, links, or no form for a shared step end).

    >>> formula("1f1b", 4, 8, 1, __import__("stagewise").Costs())["numbers"]
    '(4−1) / (8+4−1) = 3/11'
    """
    u = uniform(costs)
    if u is None:
        return None
    if name in ("gpipe", "1f1b"):
        return {"form": "(p−1) / (m+p−1)", "numbers": f"({p}−1) / ({m}+{p}−1) = {p - 1}/{m + p - 1}",
                "value": (p - 1) / (m + p - 1)}
    if name in ("interleaved-1f1b", "looped-bfs") and m >= p:
        return {"form": "(p−1) / (v·m+p−1)", "numbers": f"({p}−1) / ({v}·{m}+{p}−1) = {p - 1}/{v * m + p - 1}",
                "value": (p - 1) / (v * m + p - 1)}
    if name == "zb-h1" and m >= p and u.w <= min(u.f, u.i):
        idle, busy = (p - 1) * (u.f + u.b - 2 * u.w), m * (u.f + u.b)
        return {"form": "(p−1)(t_F+t_B−2t_W) / (m(t_F+t_B) + (p−1)(t_F+t_B−2t_W))",
                "numbers": f"{_n(idle)} / ({_n(busy)} + {_n(idle)})", "value": idle / (busy + idle)}
    return None


def _n(x: float) -> str:
    return f"{x:.4g}"
