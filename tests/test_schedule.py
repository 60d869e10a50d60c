"""Schedule properties the runtime and the engine read instead of re-deriving them."""

from __future__ import annotations

import pytest

from stagewise import Costs, ScheduleError, generate, validate
from stagewise.actions import actions_of
from stagewise.engine import play


def test_lanes_first_and_last_stages_and_stages_per_copy():
    dual = generate("dualpipe", 4, 8)  # two lanes, each a whole model copy of 4 stages
    assert dual.stages == 8 and dual.stages_per_copy == 4
    assert dual.first_stages == (0, 0, 0, 0, 4, 4, 4, 4) and dual.last_stages == (3, 3, 3, 3, 7, 7, 7, 7)
    one = generate("zb-v", 2, 4)
    assert one.stages_per_copy == 4 and set(one.first_stages) == {0} and set(one.last_stages) == {3}


@pytest.mark.parametrize("name, v", [("1f1b", None), ("zb-v", None), ("dualpipe", None), ("interleaved-1f1b", 2),
                                     ("zb-h2", None), ("dualpipe-v", None)])
def test_forward_only_keeps_each_ranks_forwards_in_order_and_never_gets_stuck(name, v):
    sched = generate(name, 4, 8, v)
    fwd = sched.forward_only()
    for full, only in zip(sched.programs, fwd.programs):
        assert list(only) == [a for op in full for a in actions_of(op) if a.kind == "F"]
    assert sum(1 for _ in fwd.actions()) == sched.stages_per_copy * sched.microbatches  # one F per (stage of its lane, mb)
    assert fwd.placement == sched.placement and fwd.lanes == sched.lanes
    play(fwd, Costs().resolve(fwd.stages))  # raises Stuck if some forward waited forever
    with pytest.raises(ScheduleError):  # not a training schedule: the validator wants every backward
        validate(fwd)
