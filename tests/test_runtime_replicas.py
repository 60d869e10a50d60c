"""Tied and duplicated copies (runtime/parallel/replicas.py): one value, summed gradients, the global norm."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from stagewise import Parallelism  # noqa: E402
from stagewise.runtime.parallel.grid import Grid  # noqa: E402
from stagewise.runtime.parallel.replicas import Replicas  # noqa: E402
from stagewise.runtime.stages.layers import Layers, build_own_stages  # noqa: E402
from stagewise.runtime.stages.names import gather_stage_map  # noqa: E402
from stagewise.runtime.stages.stage import stage_ranges  # noqa: E402
from stagewise.schedules import generate  # noqa: E402


def test_copies_start_equal_sum_their_gradients_and_count_once_in_the_norm(one_rank_group):
    sched = generate("1f1b", 1, 2)
    s = Layers(2, lambda i: nn.Linear(3, 3, bias=False), ties=(("0.weight", "1.weight"),))
    ranges = stage_ranges(sched, s.count)
    stages, _ = build_own_stages(s, ranges, [0], "cpu")
    smap = gather_stage_map(sched, s, ranges, stages, ())
    reps = Replicas(smap, stages, sched.placement, 0, torch.device("cpu"), Grid.of_parallelism(Parallelism(), 0, "cpu"))
    first, second = stages[0].layers[0].weight, stages[0].layers[1].weight
    assert first is not second and not torch.equal(first, second)  # built apart: two copies
    reps.make_equal()
    assert torch.equal(first, second)
    first.grad, second.grad = torch.ones(3, 3), 2 * torch.ones(3, 3)
    reps.sync_grads()
    assert torch.equal(first.grad, 3 * torch.ones(3, 3)) and torch.equal(second.grad, first.grad)
    norm = reps.clip([first, second], max_norm=1.0)
    assert norm == pytest.approx(math.sqrt(9 * 9))  # the logical parameter's gradient once, not both copies
    assert first.grad.norm().item() == pytest.approx(1.0, rel=1e-5)
