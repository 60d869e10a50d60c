"""Cutting a layer sequence into stages, placing them, and finding tied/duplicated parameters."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from stagewise.runtime.config import RunError
from stagewise.runtime.stages.stage import build_stages, check_cover, logical_names, partition, stage_map
from stagewise.schedules import generate
from runtime_helpers import TINY


@given(layers=st.integers(1, 40), data=st.data())
def test_even_partition_covers_every_layer_once_in_order(layers, data):
    stages = data.draw(st.integers(1, layers))
    ranges = partition(layers, stages)
    assert [i for rg in ranges for i in rg] == list(range(layers))
    sizes = [len(rg) for rg in ranges]
    assert len(sizes) == stages and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    check_cover(ranges, layers)


def test_explicit_split_is_used_as_given():
    assert partition(10, 4, [3, 2, 2, 3]) == (range(0, 3), range(3, 5), range(5, 7), range(7, 10))


@pytest.mark.parametrize("layers, stages, split, needle", [
    (4, 8, None, "4 layers but the schedule needs 8 stages"),
    (10, 4, [3, 2, 2], "`split` has 3 counts; the schedule has 4 stages"),
    (10, 4, [3, 2, 2, 2], "covers 9 layers; the model has 10, so the split loses layers"),
    (10, 4, [3, 3, 3, 3], "covers 12 layers; the model has 10, so the split duplicates"),
    (10, 4, [4, 0, 3, 3], "every stage needs at least one layer"),
])
def test_bad_partition_is_an_error_naming_the_rule(layers, stages, split, needle):
    with pytest.raises(RunError, match=needle):
        partition(layers, stages, split)


@pytest.mark.parametrize("ranges, needle", [
    ([range(0, 3), range(2, 5)], "layer 2 is in stages 0 and 1"),
    ([range(0, 2), range(3, 5)], "layer 2 is in no stage"),
    ([range(0, 2), range(2, 6)], "names layer 5"),
])
def test_explicit_ranges_must_not_lose_or_duplicate_a_layer(ranges, needle):
    with pytest.raises(RunError, match=needle):
        check_cover(ranges, 5)


def test_the_tied_head_weight_is_one_logical_parameter():
    layers = TINY.layers().build_all()
    assert layers[-1].weight is layers[0].tok.weight  # a real tie in the model itself
    names = logical_names(layers)
    assert dict(names[-1])["weight"] == "0.tok.weight"
    assert all(lg == f"{i}.{n}" for i, uses in enumerate(names[:-1]) for n, lg in uses)


def test_a_tie_across_stages_becomes_replicas_on_the_ranks_that_hold_them():
    sched = generate("1f1b", 4, 8)
    lay = stage_map(sched, TINY.layers().build_all())
    (rep,) = lay.replicas
    assert rep.name == "0.tok.weight" and rep.ranks == (0, 3)
    assert [(h.stage, h.layer, h.name) for h in rep.holders] == [(0, 0, "tok.weight"), (3, 7, "weight")]


def test_dualpipe_lanes_hold_the_same_layers_on_mirrored_ranks():
    sched = generate("dualpipe", 4, 8)
    lay = stage_map(sched, TINY.layers().build_all())
    for s in range(4):
        assert lay.ranges[s] == lay.ranges[4 + s]  # lane 1's stage p+s holds lane 0's stage s layers
        assert sched.placement[4 + s] == 3 - s
    by_name = {r.name: r for r in lay.replicas}
    assert len(by_name) == len(lay.params)  # every parameter has two copies (four for the tie)
    assert by_name["0.tok.weight"].ranks == (0, 3) and len(by_name["0.tok.weight"].holders) == 4
    assert by_name["1.qkv.weight"].ranks == (0, 3)
    assert by_name["3.qkv.weight"].ranks == (1, 2)


def test_each_stage_gets_its_own_copy_of_its_layers():
    sched = generate("zb-v", 4, 8)  # V: rank 0 holds the first and the last stage (embedding and head)
    layers = TINY.layers().build_all()
    lay = stage_map(sched, layers)
    stages = build_stages(sched, lay, layers, 0, "cpu")
    assert sorted(stages) == [0, 7]
    emb, head = stages[0].layers[0], stages[7].layers[-1]
    assert emb.tok.weight is not head.weight and emb.tok.weight is not layers[0].tok.weight
    assert (emb.tok.weight == head.weight).all()
    assert all(isinstance(m, nn.Module) for m in stages[0].layers)
