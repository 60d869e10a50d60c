"""Where a non-finite loss came from (runtime/resilience/nonfinite.py), said once per stage and rank."""

from __future__ import annotations

from stagewise.runtime.resilience.nonfinite import describe


def test_the_place_of_a_nan_names_micro_batches_stage_and_rank():
    gathered = [(0, []), (1, [(3, 5, float("nan")), (3, 2, float("inf")), (2, 0, float("nan"))])]
    assert describe(gathered) == " at micro-batch 0 (stage 2, rank 1); micro-batches 2, 5 (stage 3, rank 1)"
    assert describe([(0, []), (1, [])]) == ""
