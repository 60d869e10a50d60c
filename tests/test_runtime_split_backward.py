"""Split backward: I + W gives B's gradients, and W never runs the input-gradient path again."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from stagewise.runtime.config import RunError
from stagewise.runtime.execution.split_backward import Splitter, input_grad, weight_grad
from stagewise.runtime.stages.stage import Stage
from runtime_helpers import TINY


class CountingTanh(torch.autograd.Function):
    """tanh whose backward (an input-gradient-only path: no parameters) counts its calls."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        CountingTanh.calls += 1
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


class Squash(nn.Module):
    def forward(self, x):
        return CountingTanh.apply(x)


class Ops(TorchDispatchMode):
    """Records (op name, output shape) of every aten op run inside it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out if isinstance(out, torch.Tensor) else next(
            (t for t in out if isinstance(t, torch.Tensor)), None) if isinstance(out, (tuple, list)) else None
        self.seen.append((func.overloadpacket.__name__, None if first is None else tuple(first.shape)))
        return out


def stage_and_input(lo: int, hi: int, extra: nn.Module | None = None):
    layers = TINY.layers().build_all()
    chosen = layers[lo:hi] if extra is None else [layers[lo], extra, *layers[lo + 1:hi]]
    x, y = TINY.batch(0, 4)
    if lo > 0:
        x = torch.randn(4, TINY.seq, TINY.d_model, generator=torch.Generator().manual_seed(1), requires_grad=True)
    return Stage(0, chosen, lo), x, y


def root_and_grad(stage: Stage, x, y, last: bool):
    out = stage(x)
    if last:
        return TINY.loss(out, y), None
    return out, torch.randn(out.shape, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("lo, hi, last", [(0, 3, False), (2, 5, False), (5, 8, True)],
                         ids=["first stage (embedding)", "middle stage", "last stage (head and loss)"])
def test_input_then_weight_gradient_equals_the_full_backward(lo, hi, last):
    stage, x, y = stage_and_input(lo, hi)
    root, g = root_and_grad(stage, x, y, last)
    torch.autograd.backward(root, g)
    full = {n: p.grad.clone() for n, p in stage.named_parameters()}
    dx_full = x.grad.clone() if x.is_floating_point() else None
    stage.zero_grad(set_to_none=True)
    if dx_full is not None:
        x.grad = None

    splitter = Splitter(stage, 0)
    with splitter.record() as rec:
        root, g = root_and_grad(stage, x, y, last)
    dx = input_grad([root], None if g is None else [g], [x] if x.is_floating_point() else [], rec)
    assert all(p.grad is None for p in stage.parameters())  # I formed no weight gradient
    weight_grad(rec)
    for n, p in stage.named_parameters():
        torch.testing.assert_close(p.grad, full[n], rtol=1e-5, atol=1e-7, msg=n)
    if dx_full is not None:
        torch.testing.assert_close(dx[0], dx_full, rtol=1e-5, atol=1e-7)


def test_weight_gradient_does_not_run_the_input_gradient_path_again():
    stage, x, y = stage_and_input(2, 5, extra=Squash())
    splitter = Splitter(stage, 0)
    with splitter.record() as rec:
        out, g = root_and_grad(stage, x, y, last=False)
    CountingTanh.calls = 0
    with Ops() as during_i:
        input_grad([out], [g], [x], rec)
    assert CountingTanh.calls == 1
    with Ops() as during_w:
        weight_grad(rec)
    assert CountingTanh.calls == 1  # W did not call it again
    names_i = {n for n, _ in during_i.seen}
    names_w = {n for n, _ in during_w.seen}
    input_path = {"gelu_backward", "_scaled_dot_product_flash_attention_for_cpu_backward"}
    assert input_path <= names_i and not input_path & names_w
    param_shapes = {tuple(p.shape) for p in stage.parameters()} | {tuple(p.shape[::-1]) for p in stage.parameters()}
    products = [shape for n, shape in during_w.seen if n in ("mm", "addmm", "bmm")]
    assert products and all(shape in param_shapes for shape in products)  # every W product is a dW


def test_a_layer_used_twice_in_one_stage_is_refused_for_split_backward():
    lin = nn.Linear(4, 4)
    stage = Stage(0, [lin, lin], 0)
    splitter = Splitter(stage, 3)
    with pytest.raises(RunError, match="stage 3: module Linear ran twice"):
        with splitter.record():
            stage(torch.randn(2, 4))
    with splitter.record(enabled=False):
        stage(torch.randn(2, 4))  # without I/W it is fine


class Router(nn.Module):
    """A holder with two outputs, one made from the other (an HF MoE router's logits and top-k weights)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        logits = x @ self.weight.t()
        return logits, torch.softmax(logits, -1).topk(2, -1).values


class Routed(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = Router()

    def forward(self, x):
        logits, top = self.router(x)
        return logits.tanh().sum(-1, keepdim=True) * x + top.sum(-1, keepdim=True)


def test_a_holder_whose_outputs_are_made_from_each_other_counts_each_path_once():
    torch.manual_seed(0)
    stage = Stage(0, [Routed()], 0)
    x = torch.randn(3, 6, requires_grad=True)
    g = torch.randn(3, 6)
    torch.autograd.backward(stage(x), g)
    full = stage.layers[0].router.weight.grad.clone()
    stage.zero_grad(set_to_none=True)
    splitter = Splitter(stage, 0)
    with splitter.record() as rec:
        out = stage(x)
    assert len(rec.outputs[0][1]) == 1  # only the logits: the top-k weights are made from them
    input_grad([out], [g], [x], rec)
    weight_grad(rec)
    torch.testing.assert_close(stage.layers[0].router.weight.grad, full)
