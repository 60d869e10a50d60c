"""1F1B, PipeDream-flush (Narayanan et al. 2019, 2021).

Rank r runs ``warmup = ranks - r - 1`` forwards, then alternates one forward
and one backward, then drains the remaining backwards. The bubble equals
GPipe's, (p-1)/(m+p-1), but rank r holds only ``ranks - r`` activations.
"""

from ..actions import Action
from ..schedule import Schedule, make


def one_f_one_b(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    m = microbatches
    programs = []
    for r in range(ranks):
        warmup = min(ranks - r - 1, m)
        prog = [Action("F", r, mb) for mb in range(warmup)]  # warmup
        for i in range(m - warmup):  # steady 1F1B
            prog += [Action("F", r, warmup + i), Action("B", r, i)]
        prog += [Action("B", r, mb) for mb in range(m - warmup, m)]  # cooldown
        programs.append(prog)
    return make("1f1b", programs, range(ranks), m)
