"""Long steps costed from two shorter ones: past its warm-up a schedule repeats itself.

A step of many micro-batches per replica (a small model with a large batch on few
GPUs: m in the thousands) is a warm-up, a steady state that repeats with every
micro-batch, and a cool-down. The cluster search therefore builds and simulates the
family at ``mc`` and ``2 mc`` micro-batches (``mc = LONG x p x v``, at least
``SHORTEST``; V-Half and V-Min repeat from their first block: ``p x v``) instead of ``m``: the makespan grows by the same amount per micro-batch
between them, so

    makespan(m) = makespan(2 mc) + (m - 2 mc) x (makespan(2 mc) - makespan(mc)) / mc

and the busy time likewise. This is used only when the two shorter schedules hold the
same peak activations (1F1B and its kin keep p micro-batches whatever m is; GPipe and
looped BFS hold more with every micro-batch and are built at full length), only for
m > 2 mc (and m a multiple of p for the families that take any v). tests/test_plan_steady.py checks the estimate against the
full simulation for every family: exact for most, within 1% for ZB-H2 (its W-filling
drifts with m) and interleaved 1F1B.
"""

from __future__ import annotations

from ...schedules import FAMILIES

LONG = 2  #: the shorter steps have LONG x p x v micro-batches: past the warm-up (exact within 1% on the test grid)
#: families whose schedule repeats from its first building block (V-Half, V-Min: one block per micro-batch,
#: Qi et al. 2024), so half as long a stand-in is exact; their generator is the costliest to run
LONG_BY_FAMILY = {"v-half": 1, "v-min": 1}
SHORTEST = 16


def short_m(family: str, p: int, m: int, v: int) -> int | None:
    """The micro-batch count ``mc`` a step of ``m`` is costed from, or None when ``m`` is built in full."""
    fam = FAMILIES[family]
    mc = max(LONG_BY_FAMILY.get(family, LONG) * p * v, SHORTEST, fam.min_microbatches(p, v))
    rounds = fam.chunks is None  # any v (interleaved 1F1B, looped BFS): the step changes shape with m mod p
    if rounds:
        mc += -mc % p
    if fam.even_microbatches:
        mc += mc % 2
    return mc if m > 2 * mc and (m % p == 0 or not rounds) else None


def extend(short: tuple[float, float], longer: tuple[float, float], mc: int, m: int) -> tuple[float, float]:
    """(makespan, busy) at ``m`` from those at ``mc`` and ``2 mc`` micro-batches."""
    (t1, b1), (t2, b2) = short, longer
    more = m - 2 * mc
    return t2 + more * (t2 - t1) / mc, b2 + more * (b2 - b1) / mc
