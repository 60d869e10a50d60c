"""Sequence slices (Seq1F1B): a micro-batch cut into ``k`` slices along the sequence that flow as pipeline units.

A schedule with ``slices = k`` counts units: unit ``u`` is slice ``u % k`` of micro-batch ``u // k``. On a
stage, slice j's forward attends to the keys and values of slices 0..j-1 (it runs after their forwards), and
the backwards run in reverse: slice j's backward hands the gradient of those keys and values back to slice
j-1's, which runs after it.

>>> unit(2, 1, 4), split_unit(9, 4)
(9, (2, 1))
"""

from __future__ import annotations


def unit(mb: int, j: int, k: int) -> int:
    """The unit index of slice ``j`` of micro-batch ``mb`` with ``k`` slices per micro-batch."""
    return mb * k + j


def split_unit(u: int, k: int) -> tuple[int, int]:
    """(micro-batch, slice) of unit ``u``."""
    return divmod(u, k)
