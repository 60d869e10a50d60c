"""1F1B, PipeDream-flush (Narayanan et al. 2019, 2021).

Rank r runs ``warmup = ranks - r - 1`` forwards, then alternates one forward
and one backward, then drains the remaining backwards. The bubble equals
GPipe's, (p-1)/(m+p-1), but rank r holds only ``ranks - r`` activations.
"""

from ..actions import Action, new, run
from ..schedule import Schedule, make


def one_f_one_b(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    m = microbatches
    programs = []
    for r in range(ranks):
        warmup = min(ranks - r - 1, m)
        prog = run("F", r, range(warmup))  # warmup
        for i in range(m - warmup):  # steady 1F1B
            prog += (new(Action, ("F", r, warmup + i)), new(Action, ("B", r, i)))
        prog += run("B", r, range(m - warmup, m))  # cooldown
        programs.append(prog)
    return make("1f1b", programs, range(ranks), m)
