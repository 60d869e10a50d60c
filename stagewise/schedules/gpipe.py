"""GPipe (Huang et al. 2019): all forwards, then all backwards.

Every rank keeps all m micro-batches' activations at the turn.
"""

from ..actions import run
from ..schedule import Schedule, make


def gpipe(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    programs = []
    for r in range(ranks):
        # fill: m forwards; drain: m backwards in the same order
        prog = run("F", r, range(microbatches))
        prog += run("B", r, range(microbatches))
        programs.append(prog)
    return make("gpipe", programs, range(ranks), microbatches)
