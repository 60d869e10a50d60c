"""``stagewise.launch`` (runtime/launching/local.py): a user's function on local ranks, bad arguments refused."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

import stagewise  # noqa: E402
from stagewise.runtime.launching.launch import RankFailure  # noqa: E402
from stagewise.runtime.config import RunError  # noqa: E402


@pytest.mark.parametrize("ranks, words", [(0, "`ranks` must be a whole number >= 1; got 0"),
                                          ("2", "`ranks` must be a whole number >= 1; got '2'"),
                                          (10**9, "`ranks` 1000000000: over the limit of 256 ranks started")])
def test_bad_rank_counts_are_refused_before_any_process_starts(ranks, words):
    with pytest.raises(stagewise.StagewiseError, match=words):
        stagewise.launch(math.log, ranks, 1.0)


def test_a_zero_timeout_is_refused():
    with pytest.raises(RunError, match="`timeout` must be a finite number > 0; got 0"):
        stagewise.launch(math.log, 2, 1.0, timeout=0)


@pytest.mark.slow
def test_a_failure_on_every_rank_names_where_it_was_raised():
    with pytest.raises(RankFailure, match=r"every rank: ValueError: math domain error"):
        stagewise.launch(math.log, 2, 0.0)
