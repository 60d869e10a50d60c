"""The papers' closed forms, one small function each; the registry attaches them to families.

Each idle form takes (p, m, v, u) with ``u`` the uniform per-stage costs and
returns the largest idle time of a rank on a shared step end, or None outside
the conditions where the simulator confirms it exactly (tests/test_formulas.py).
Each memory form gives the paper's peak activations of the busiest rank in
micro-batches of one rank's share of the model (1F1B holds p of them).
"""

from __future__ import annotations

from collections import namedtuple


class Uniform(namedtuple("Uniform", ("f", "b", "i", "w", "fb"))):
    """One duration per action kind, the same on every stage, links free (``fb``: an overlapped F&B pair)."""

    __slots__ = ()


def fill(p: int, m: int, v: int, u: Uniform) -> float:
    """GPipe, 1F1B (PipeDream-flush): (p-1)(F+B), any m."""
    return (p - 1) * (u.f + u.b)


def fill_from_p(p: int, m: int, v: int, u: Uniform) -> float | None:
    """Interleaved 1F1B, looped BFS (Narayanan et al. 2021): (p-1)(F+B) in per-chunk costs, m >= p."""
    return (p - 1) * (u.f + u.b) if m >= p else None


def zb_h1(p: int, m: int, v: int, u: Uniform) -> float | None:
    """ZB-H1 (Qi et al. 2024; DualPipe README's ZB1P row): (p-1)(F+B-2W), m >= p, W <= min(F, I)."""
    return (p - 1) * (u.f + u.b - 2 * u.w) if m >= p and u.w <= min(u.f, u.i) else None


def dualpipe_idle(stages_of: int):
    """DeepSeek-V3's DualPipe table: (PP/2-1)(F&B+B-3W), PP = stages_of * p (DualPipeV is DualPipe on 2p ranks,
    halved), when F = I = W and B <= F&B <= F + B."""

    def idle(p: int, m: int, v: int, u: Uniform) -> float | None:
        if not (u.f == u.i == u.w and u.b <= u.fb <= u.f + u.b):
            return None
        return (stages_of * p / 2 - 1) * (u.fb + u.b - 3 * u.w)

    return idle


def one_f_one_b_memory(p: int, m: int, v: int) -> float:
    """1F1B and its kin keep p micro-batches on the first rank (fewer when m < p)."""
    return min(p, m)


def sliced(form):
    """A form over units made a Seq1F1B form over m micro-batches of k slices, in a micro-batch's costs ``u``: the
    units' form at 1/k of the costs, where m >= p when the units' form needs m >= p (ZB-H1's shape over slices
    with fewer micro-batches than ranks idles more than its form: the simulator finds it)."""

    def idle(p: int, m: int, v: int, u: Uniform, k: int = 1) -> float | None:
        if k == 1:
            return form(p, m, v, u)
        if form is not fill and m < p:
            return None
        return form(p, m * k, v, Uniform(*(x / k for x in u)))

    idle.__doc__ = f"{form.__doc__} Over slices: m k units of 1/k of the costs."
    return idle


def seq1f1b_memory(p: int, m: int, v: int, k: int = 1) -> float:
    """Seq1F1B (Sun et al. 2025): the first rank holds p + k - 1 slices of 1/k of a micro-batch each (all m k
    when fewer), (p + k - 1)/k micro-batches: 1F1B's p at k = 1, toward p/k as k grows (equal slices, no
    keys/values kept twice: ``costs.slice_activation`` with ``kv_share`` 0)."""
    return min(p + k - 1, m * k) / k
