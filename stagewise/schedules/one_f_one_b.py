"""1F1B, PipeDream-flush (Narayanan et al. 2019, 2021).

Rank r runs ``warmup = ranks - r - 1`` forwards, then alternates one forward
and one backward, then drains the remaining backwards. The bubble equals
GPipe's, (p-1)/(m+p-1), but rank r holds only ``ranks - r`` activations.
"""

from ..actions import Action, new, run
from ..schedule import Schedule, make


def one_f_one_b(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    m = microbatches
    programs = [program(r, min(ranks - r - 1, m), range(m), range(m)) for r in range(ranks)]
    return make("1f1b", programs, range(ranks), m)


def program(stage: int, warmup: int, forwards, backwards) -> list[Action]:
    """``warmup`` forwards, then one forward and one backward, then the remaining backwards: the 1F1B shape
    over the units ``forwards`` and ``backwards`` run in (micro-batches; Seq1F1B's slices, backwards reversed
    within a micro-batch)."""
    n = len(forwards)
    prog = run("F", stage, forwards[:warmup])  # warmup
    for i in range(n - warmup):  # steady 1F1B
        prog += (new(Action, ("F", stage, forwards[warmup + i])), new(Action, ("B", stage, backwards[i])))
    prog += run("B", stage, backwards[n - warmup:])  # cooldown
    return prog
