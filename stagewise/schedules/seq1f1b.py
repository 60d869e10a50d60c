"""Seq1F1B (Sun et al., NAACL 2025, arXiv:2406.03488): 1F1B over sequence slices.

Each micro-batch is cut into ``slices = k`` slices along the sequence that flow through the pipeline as units
(``stagewise.slices``: unit u is slice u % k of micro-batch u // k). Forwards run the units in order (slice j
attends to the keys and values of slices 0..j-1, computed before it on the same stage); backwards run each
micro-batch's slices in reverse (slice j hands the gradient of those keys and values back to slice j-1).

- ``seq1f1b``: 1F1B's shape over the units, the warm-up counted in slices: rank r runs ``p - r + k - 2``
  forwards first (the authors' Megatron code), since the last stage needs all k slices of a micro-batch before
  the backward of its last slice. With slices of equal compute (the paper's computation-wise partition) the
  bubble shrinks to (p-1)(F+B)/k and rank 0 holds p + k - 1 slices, (p + k - 1)/k micro-batches, at its peak
  (1F1B: p). k = 1 is 1F1B.
- ``seq1f1b-zb``: the same units with Zero Bubble's split backward (ZB-H1's shape, the authors' Seq1F1B-ZB):
  ``p - r + k - 1`` warm-up forwards, then I [W] F with W put off by r to fill the cooldown. k = 1 is ZB-H1.
"""

from __future__ import annotations

from ..schedule import Schedule, make
from .one_f_one_b import program
from .zero_bubble import split_program


def backward_order(units: int, k: int) -> list[int]:
    """The units in the order their backwards run: each micro-batch's k slices last to first.

    >>> backward_order(4, 2)
    [1, 0, 3, 2]
    """
    return [u - u % k + (k - 1 - u % k) for u in range(units)]


def seq1f1b(ranks: int, microbatches: int, chunks: int = 1, slices: int = 1) -> Schedule:
    p, k = ranks, slices
    n = microbatches * k
    back = backward_order(n, k)
    programs = [program(r, min(p - r + k - 2, n), range(n), back) for r in range(p)]
    return make("seq1f1b", programs, range(p), n, slices=k)


def seq1f1b_zb(ranks: int, microbatches: int, chunks: int = 1, slices: int = 1) -> Schedule:
    p, k = ranks, slices
    n = microbatches * k
    back = backward_order(n, k)
    programs = [split_program(r, n, warmup=p - r + k - 1, delay=r, backwards=back) for r in range(p)]
    return make("seq1f1b-zb", programs, range(p), n, slices=k)
