"""An optimizer and an optimizer state checked against this rank's parameters (runtime/stages/optim_checks.py).
Through Pipeline.optimizer_state_dict / load_optimizer_state_dict on 2 ranks: test_runtime_tp.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from stagewise.runtime.config import RunError  # noqa: E402
from stagewise.runtime.stages.optim_checks import check_optimizer, check_state  # noqa: E402

KEEPS = {"w": {"exp_avg": torch.zeros(2, 3), "exp_avg_sq": torch.zeros(2, 3), "step": torch.zeros(())}}
GOOD = {"state.w.exp_avg": torch.ones(2, 3), "state.w.exp_avg_sq": torch.ones(2, 3), "state.w.step": 3.0,
        "param_groups.w.lr": 0.1}


def test_an_optimizer_over_other_tensors_or_none_is_refused():
    here = [nn.Parameter(torch.zeros(2, 3))]
    check_optimizer(torch.optim.SGD(here, lr=0.1), here)
    with pytest.raises(RunError, match=r"`optimizer` holds a tensor of shape \(4,\) that is not one of this "):
        check_optimizer(torch.optim.SGD([nn.Parameter(torch.zeros(4))], lr=0.1), here)
    with pytest.raises(RunError, match="`optimizer` must be a torch.optim.Optimizer"):
        check_optimizer({"lr": 0.1}, here)


@pytest.mark.parametrize("state, words", [
    ({"state": 5}, "`state` key 'state' is not state.NAME.KEY or param_groups.NAME.KEY"),
    ([("state.w.exp_avg", 1)], "`state` must be a dict in optimizer_state_dict's form"),
    ({**GOOD, "state.v.exp_avg": torch.ones(1)}, "`state` key 'state.v.exp_avg' names no parameter of the model"),
    ({**GOOD, "state.w.exp_avg": torch.ones(3, 2)}, r"'state.w.exp_avg' has shape \(3, 2\); the optimizer's is \(2, 3\)"),
    ({**GOOD, "state.w.momentum_buffer": torch.ones(2, 3)}, "AdamW keeps no momentum_buffer"),
    ({k: v for k, v in GOOD.items() if k != "state.w.step"}, "`state` has no 'state.w.step'"),
    ({**GOOD, "state.w.step": "3"}, r"'state.w.step' is str; the optimizer keeps a tensor of shape \(\)"),
    ({}, "`state` holds no optimizer state of parameter w"),
])
def test_a_state_that_does_not_fit_is_refused_naming_the_key(state, words):
    with pytest.raises(RunError, match=words):
        check_state(state, KEEPS, {"w", "v2"}, "AdamW")


def test_a_state_of_the_optimizers_form_passes_and_so_do_hyperparameters_alone():
    check_state(GOOD, KEEPS, {"w"}, "AdamW")
    check_state({"param_groups.w.lr": 0.5}, KEEPS, {"w"}, "AdamW")
