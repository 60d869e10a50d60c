"""The model forms the Pipeline takes, as one Layers value: names, ties, split points."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from api_helpers import Net, layers
from stagewise import Layers, generate
from stagewise.runtime.config import RunError
from stagewise.runtime.stages.layers import as_layers, build_own_stages, flat_layers, split_counts
from stagewise.runtime.stages.stage import stage_ranges


def test_a_sequence_is_named_by_position_and_its_shared_parameter_is_a_tie():
    spec = as_layers(layers())
    assert spec.count == 8 and spec.prefix(7) == "7"
    assert spec.ties == (("0.weight", "7.weight"),)


def test_a_module_is_its_children_with_module_lists_expanded():
    assert [n for n, _ in flat_layers(Net())] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm",
                                                  "head"]


@pytest.mark.parametrize("split, counts", [(["blocks.2"], (3, 4)), ((2, 5), (2, 5)), ("E+t*2 | t*2+N+H", (3, 4)),
                                           (["blocks.0", "norm"], (1, 4, 2))])
def test_split_points_names_counts_or_layout_text(split, counts):
    assert split_counts(split, [n for n, _ in flat_layers(Net())]) == counts


def test_split_points_out_of_order_are_refused():
    with pytest.raises(RunError, match="must name layers after the first, in model order"):
        split_counts(["norm", "blocks.0"], [n for n, _ in flat_layers(Net())])


def test_a_meta_module_is_materialized_layer_by_layer_only_when_built():
    with torch.device("meta"):
        net = Net()
    spec = as_layers(net, split=["blocks.2"])
    sched = generate("1f1b", 2, 4)
    stages, _ = build_own_stages(spec, stage_ranges(sched, spec.count, spec.split), [1], "cpu")
    assert all(not p.is_meta for p in stages[1].parameters())
    assert all(p.is_meta for p in net.parameters())  # the user's model stays on the meta device
    assert sorted(n for n, _ in stages[1].named_parameters()) == sorted(
        f"layers.{k}.{n}" for k, (_, m) in enumerate(flat_layers(Net())[3:], 0) for n, _ in m.named_parameters())


def test_from_modules_keeps_names_and_finds_ties():
    emb = nn.Embedding(4, 2)
    head = nn.Linear(2, 4, bias=False)
    head.weight = emb.weight
    spec = Layers.from_modules([("model.embed", emb), ("lm_head", head)])
    assert spec.names == ("model.embed", "lm_head") and spec.ties == (("model.embed.weight", "lm_head.weight"),)


def test_a_second_use_of_a_layer_on_one_rank_is_a_copy():
    sched = generate("zb-v", 2, 4)  # rank 0 holds stages 0 and 3: the embedding and the tied head
    spec = as_layers(layers())
    stages, _ = build_own_stages(spec, stage_ranges(sched, spec.count), sched.stages_of_rank(0), "cpu")
    emb, head = stages[0].layers[0].weight, stages[3].layers[-1].weight
    assert emb is not head and torch.equal(emb, head)
