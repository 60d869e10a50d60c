"""The one place a schedule is resolved (runtime/resolve.py): one message per rule."""

from __future__ import annotations

import pytest

from stagewise import torch_csv
from stagewise.runtime.config import RunError
from stagewise.runtime.resolve import resolve_schedule
from stagewise.schedules import generate


def test_a_name_is_made_for_the_pipeline_ranks_of_the_world():
    s = resolve_schedule("zb-v", world=4, dp=2, microbatches=4)
    assert (s.name, s.ranks, s.microbatches, s.chunks) == ("zb-v", 2, 4, 2)


def test_a_value_and_a_csv_must_be_for_the_ranks_launched(tmp_path):
    four = generate("1f1b", 4, 4)
    assert resolve_schedule(four, world=8, dp=2) is four
    with pytest.raises(RunError, match=r"schedule 1f1b: the schedule's placement needs 4 ranks \(stage 3 is on rank "
                                       r"3\); 2 were launched .*: launch 4 \(torchrun --nproc-per-node 4\)"):
        resolve_schedule(four, world=2)
    path = tmp_path / "four.csv"
    torch_csv.dump(four, path)
    with pytest.raises(RunError, match=f"`csv` {path}: the schedule's placement needs 4 ranks"):
        resolve_schedule(None, csv=str(path), world=2)


@pytest.mark.parametrize("kwargs, words", [
    (dict(schedule="1f1b", world=4, dp=3), "`dp` 3 does not divide the 4 ranks launched"),
    (dict(schedule="1f1b", world=4), "schedule '1f1b' needs `microbatches`"),
    (dict(schedule=generate("1f1b", 2, 4), world=2, microbatches=8), "`microbatches` 8 but the schedule 1f1b has 4"),
    (dict(schedule=3, world=2), "`schedule` must be a family name or a Schedule; got int"),
    (dict(schedule="1f1b", world=6, dp=2, microbatches=4, ranks=2, launched_by="WORLD_SIZE=6"),
     r"1f1b with `ranks` 2 needs 2 ranks per replica; 3 were launched per replica \(`dp` 2\) \(WORLD_SIZE=6\)"),
])
def test_each_rule_has_one_message(kwargs, words):
    with pytest.raises(RunError, match=words):
        resolve_schedule(**kwargs)
