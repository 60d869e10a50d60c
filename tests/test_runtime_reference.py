"""The unpipelined reference (runtime/run/reference.py): the oracle every schedule is compared with."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from runtime_helpers import TINY  # noqa: E402

from stagewise.runtime import RunConfig  # noqa: E402
from stagewise.runtime.run.reference import run_reference  # noqa: E402


def test_the_reference_is_a_plain_loop_over_the_same_layers_with_the_tie_shared():
    res = run_reference(RunConfig(schedule=None, ranks=1, steps=2, batch=4, model=TINY, lr=1e-3))
    layers = TINY.layers().build_all()
    assert layers[-1].weight is layers[0].tok.weight  # one Parameter used twice, as a plain model has it
    model = nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for k, got in enumerate(res.losses):
        x, y = TINY.batch(k, 4)
        loss = TINY.loss(model(x), y)
        assert got == pytest.approx(loss.item(), rel=1e-6)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert (res.schedule, res.ranks) == ("none", 1)
