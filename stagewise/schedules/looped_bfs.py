"""Looped breadth-first pipeline (Lamy-Poirier 2022, arXiv:2211.05953).

Same round-robin placement as interleaved 1F1B (rank r holds stages
``r, r + p, ...``), but breadth-first: every micro-batch goes through a chunk
before the rank moves to its next chunk, GPipe-style. The backward walks the
chunks in reverse, last micro-batch first (its activations are the freshest).
Every rank keeps all v * m activations at the turn.
"""

from __future__ import annotations

from ..actions import Action, new
from ..schedule import Schedule, make


def looped_bfs(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m, v = ranks, microbatches, chunks
    programs = []
    for r in range(p):
        stages = range(r, p * v, p)
        prog = [new(Action, ("F", s, mb)) for s in stages for mb in range(m)]  # forward loops
        prog += [new(Action, ("B", s, mb)) for s in reversed(stages) for mb in reversed(range(m))]  # backward loops
        programs.append(prog)
    return make("looped-bfs", programs, [s % p for s in range(p * v)], m)
