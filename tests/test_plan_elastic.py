"""The re-plan for the ranks left (``stagewise.plan.elastic``): dp replicas first, then fewer stages split by the
partitioner; the global batch and the micro-batch size kept; what cannot be had is refused naming why."""

import pytest

from stagewise.parallelism import Parallelism
from stagewise.plan.elastic import ElasticError, replan


def test_dp_replicas_go_first_and_their_rows_become_more_micro_batches():
    r = replan(Parallelism(pp=2, dp=4, zero=1), ranks_left=5, minimum=2, microbatches=2, batch=16, schedule="1f1b")
    assert (r.parallelism, r.microbatches, r.split) == (Parallelism(pp=2, dp=2, zero=1), 4, None)
    r = replan(Parallelism(pp=2, dp=2, zero=1), ranks_left=3, minimum=2, microbatches=2, batch=16)
    assert (r.parallelism, r.microbatches) == (Parallelism(pp=2), 4)  # ZeRO-1 needs replicas: off
    assert "m 2 -> 4 keeps the global batch 16 in micro-batches of 4" in r.why


def test_then_fewer_stages_split_by_the_partitioner_from_the_layer_costs():
    costs = (1, 4, 4, 4, 4, 4, 4, 1)  # an embedding, six blocks, a head
    r = replan(Parallelism(pp=4), ranks_left=3, minimum=2, microbatches=4, batch=8, schedule="1f1b", layer_time=costs)
    assert r.parallelism == Parallelism(pp=3) and r.microbatches == 4
    assert sum(r.split) == 8 and r.split == (3, 2, 3)  # the slowest stage as light as it can be
    r = replan(Parallelism(pp=2, fsdp=2), ranks_left=3, minimum=2, microbatches=2, batch=8)
    assert r.parallelism == Parallelism(pp=1, fsdp=2)  # fsdp kept: it shards what one rank cannot hold


def test_what_cannot_be_had_is_refused_naming_why():
    with pytest.raises(ElasticError, match="`elastic` MIN 3: only 2 ranks are left"):
        replan(Parallelism(pp=2, dp=2), ranks_left=2, minimum=3, microbatches=2, batch=8)
    with pytest.raises(ElasticError, match="one rank runs the unpipelined reference"):
        replan(Parallelism(pp=2), ranks_left=1, minimum=1, microbatches=2, batch=8)
    with pytest.raises(ElasticError, match="no layout fits the 1 rank left .*needs at least 4 ranks per replica"):
        replan(Parallelism(pp=2, tp=2), ranks_left=1, minimum=1, microbatches=2, batch=8)


def test_a_layout_that_does_not_divide_or_fit_the_layers_is_passed_over():
    r = replan(Parallelism(pp=1, dp=3, tp=2), ranks_left=4, minimum=1, microbatches=1, batch=3)
    assert r.parallelism == Parallelism(pp=1, dp=1, tp=2) and r.microbatches == 3  # dp 2 cannot take m x dp = 3
    r = replan(Parallelism(pp=4), ranks_left=3, minimum=1, microbatches=4, batch=8, schedule="1f1b",
               layer_time=(1, 1))
    assert r.parallelism == Parallelism(pp=2) and r.split == (1, 1)  # 3 stages need 3 layers


def test_fewer_stages_that_would_not_hold_the_model_state_are_refused():
    costs, state = (1, 4, 4, 4, 4, 1), (10e9, 20e9, 20e9, 20e9, 20e9, 10e9)  # bytes of weights + optimizer
    r = replan(Parallelism(pp=4), ranks_left=3, minimum=1, microbatches=4, batch=8, schedule="1f1b",
               layer_time=costs, layer_bytes=state, memory=45e9)
    assert r.parallelism.pp == 3 and r.split == (2, 2, 2)  # 30 + 40 + 30 GB: each under 45
    with pytest.raises(ElasticError, match=r"pp 2: its fullest rank would hold .* GiB of model state, over the 41.9 GiB of a device"):
        replan(Parallelism(pp=3), ranks_left=2, minimum=1, microbatches=4, batch=8, schedule="1f1b",
               layer_time=costs, layer_bytes=state, memory=45e9)
