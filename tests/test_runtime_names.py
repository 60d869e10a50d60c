"""Names end to end (runtime/stages/names.py): the original model's names, ties resolved by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from stagewise.runtime.config import RunError  # noqa: E402
from stagewise.runtime.stages.layers import Layers  # noqa: E402
from stagewise.runtime.stages.names import Names, gather_stage_map  # noqa: E402
from stagewise.runtime.stages.stage import stage_ranges  # noqa: E402
from stagewise.runtime.stages.layers import build_own_stages  # noqa: E402
from stagewise.schedules import generate  # noqa: E402


def spec():
    return Layers(3, lambda i: nn.Linear(4, 4), names=("embed", "blocks.0", "head"),
                  ties=(("embed.weight", "head.weight"),))


def test_logical_names_map_to_the_original_ones_and_ties_are_one_parameter(one_rank_group):
    sched = generate("1f1b", 1, 2)
    s = spec()
    ranges = stage_ranges(sched, s.count)
    stages, built = build_own_stages(s, ranges, [0], "cpu")
    smap = gather_stage_map(sched, s, ranges, stages, ())
    names = Names(s, smap, sched, stages, 0)
    assert built == (0, 1, 2) and names.original("1.bias") == "blocks.0.bias"
    assert [h.layer for h in smap.params["0.weight"]] == [0, 2]  # the head's weight is the embedding's
    sd = names.state_dict()
    assert set(sd) == {"embed.weight", "embed.bias", "blocks.0.weight", "blocks.0.bias", "head.weight", "head.bias"}


def test_a_tie_that_names_no_parameter_is_refused(one_rank_group):
    sched = generate("1f1b", 1, 2)
    s = Layers(2, lambda i: nn.Linear(4, 4), ties=(("0.weight", "1.scale"),))
    ranges = stage_ranges(sched, s.count)
    stages, _ = build_own_stages(s, ranges, [0], "cpu")
    with pytest.raises(RunError, match=r"ties: '1.scale' is not a parameter of the model"):
        gather_stage_map(sched, s, ranges, stages, ())
