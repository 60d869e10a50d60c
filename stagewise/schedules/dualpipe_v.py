"""DualPipeV: DualPipe cut in half (Sea AI Lab; deepseek-ai/DualPipe dualpipev.py).

Fold DualPipe on 2p ranks in the middle: the two directions become the two
arms of one V over 2p stages, rank r holding stage r (on the way down) and
stage 2p-1-r (on the way back up). One copy of the parameters, all m
micro-batches through one lane. Each rank runs DualPipe's eight steps with
phase 0 = its stage going down, phase 1 = its stage coming back, the bottom
of the V (rank p-1) playing DualPipe's middle rank.
"""

from __future__ import annotations

from ..schedule import Schedule, make
from .dualpipe import eight_steps, overlapped_pairs


def dualpipe_v(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m = ranks, microbatches
    programs = [eight_steps(r, p, m, (r, 0), (2 * p - 1 - r, 0)) for r in range(p)]
    placement = [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    return make("dualpipe-v", programs, placement, m)


def pairs(ranks: int, microbatches: int) -> list[int]:
    """F&B pairs per rank: rank r plays DualPipe's rank at distance r of p, all m micro-batches a phase."""
    return [overlapped_pairs(r, ranks, microbatches) for r in range(ranks)]
