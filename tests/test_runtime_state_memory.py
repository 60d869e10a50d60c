"""What a rank holds of the model's state, counted and predicted (runtime/parallel/state_memory.py), unsharded."""

import pytest

torch = pytest.importorskip("torch")

from stagewise.runtime.parallel.state_memory import held_bytes, predicted_bytes  # noqa: E402


def test_adam_holds_two_moments_and_the_prediction_agrees_without_sharding():
    params = [torch.nn.Parameter(torch.zeros(10, 4)), torch.nn.Parameter(torch.zeros(4))]
    opt = torch.optim.Adam(params)
    sum(p.sum() for p in params).backward()
    opt.step()
    whole = 44 * 4  # float32 bytes of both parameters
    assert held_bytes(params, opt) == {"parameters": whole, "gradients": whole, "optimizer": 2 * whole}
    assert predicted_bytes(params, "adam") == {"parameters": whole, "gradients": whole, "optimizer": 2 * whole}
    assert predicted_bytes(params, "adamw", zero_over=2)["optimizer"] == whole  # ZeRO-1 over 2 replicas


def test_an_unknown_optimizer_has_no_predicted_state():
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert predicted_bytes(params, "sgd")["optimizer"] is None
    assert held_bytes(params, torch.optim.SGD(params, lr=0.1))["gradients"] == 0  # none formed yet
