"""Split backward: ``I`` (input gradients) now, ``W`` (weight gradients) later.

During the forward of a split (stage, mb), every *holder* module (one with
parameters of its own: a Linear, a LayerNorm, an Embedding) has its output
recorded. ``I`` runs one autograd pass from the stage output to the stage
input *and* to every recorded holder output; autograd computes only what lies
on those paths, so no weight gradient is formed, and it hands back the
gradient at each holder output. ``W`` then differentiates each holder output
with respect to that holder's own parameters only, seeded with the saved
gradient (for a plain ``nn.Linear`` directly as the one product g^T x, with
the input it saw, which autograd keeps anyway); nothing of the input-gradient
path runs again (tests/test_runtime_split_backward.py counts it).

Assumption: within one stage a holder runs once per forward and no parameter
is shared by two holders (the stage builder unties shared weights). A holder
whose own parameters are used before its submodules makes ``W`` redo that
submodule path (correct, slower). A holder with several outputs, some computed
from others (an HF MoE router returns its logits and the top-k weights made from
them), records only those made from none of the others: I's gradient at such an
output already holds the paths through the ones made from it, which W would
otherwise count twice.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import RunError


@dataclass(kw_only=True)
class Record:
    """What one split (stage, mb) keeps from F to W. Mutable: filled by F, then I, emptied by W."""

    outputs: list = field(default_factory=list)  #: (module, output tensors, Linear input or None) per holder call
    grads: list | None = None  #: gradient at each holder output, set by I


class Splitter:
    """Records holder outputs of one stage's forward. Mutable: the record being filled."""

    def __init__(self, stage: nn.Module, stage_index: int):
        self.stage_index = stage_index
        self._active: Record | None = None
        self._seen: set[int] = set()
        self._handles = [m.register_forward_hook(self._hook) for m in holders(stage)]

    @contextmanager
    def record(self, enabled: bool = True):
        """Record holder outputs of the forward run inside the block (when ``enabled``)."""
        rec = Record() if enabled else None
        self._active, self._seen = rec, set()
        try:
            yield rec
        finally:
            self._active = None

    def _hook(self, module: nn.Module, args, output) -> None:
        rec = self._active
        if rec is None:
            return
        if id(module) in self._seen:
            raise RunError(f"stage {self.stage_index}: module {type(module).__name__} ran twice in one forward; "
                           "split backward (I/W) needs each parameter used once per stage (use a schedule without "
                           "I/W, or another split)")
        self._seen.add(id(module))
        outs = tuple(t for t in _tensors(output) if t.requires_grad)
        if len(outs) > 1:
            outs = _independent(outs, args)
        if outs:
            # a plain Linear's dW = g^T x is one product: W computes it without the autograd engine (not for a
            # tensor-parallel one: its weight and input are DTensors, which autograd differentiates)
            x = args[0] if (type(module) is nn.Linear and len(outs) == 1 and module.weight.requires_grad
                            and type(module.weight) is nn.Parameter and type(args[0]) is torch.Tensor) else None
            rec.outputs.append((module, outs, x))


def _independent(outs: tuple, inputs) -> tuple:
    """The outputs computed from no other output of the same call (the module's own graph is walked back to its
    inputs)."""
    stop = {t.grad_fn for t in _tensors(inputs) if t.grad_fn is not None}
    nodes = {t.grad_fn for t in outs}
    return tuple(t for t in outs if not _reaches(t.grad_fn, nodes - {t.grad_fn}, stop))


def _reaches(start, targets: set, stop: set) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node is None or node in seen or node in stop:
            continue
        if node in targets:
            return True
        seen.add(node)
        todo.extend(fn for fn, _ in node.next_functions)
    return False


def holders(module: nn.Module) -> list[nn.Module]:
    """Modules that own trainable parameters directly."""
    return [m for m in module.modules() if any(p is not None and p.requires_grad for p in m._parameters.values())]


def input_grad(roots: list, grads: list | None, xs: list, rec: Record) -> tuple:
    """I: the gradients at the stage input leaves ``xs`` (zeros for one the stage did not use); saves
    holder-output gradients in ``rec``. ``roots``: the loss, or the output leaves with ``grads``."""
    targets = [t for _, outs, _ in rec.outputs for t in outs]
    if not roots or not xs + targets:
        rec.grads = [None] * len(targets)
        return tuple(torch.zeros_like(x) for x in xs)
    got = torch.autograd.grad(roots, xs + targets, grad_outputs=grads, retain_graph=True, allow_unused=True)
    rec.grads = list(got[len(xs):])
    return tuple(g if g is not None else torch.zeros_like(x) for g, x in zip(got, xs))


def weight_grad(rec: Record) -> None:
    """W: accumulate each holder's parameter gradients from the gradients I saved.

    Every holder's parameters are taken before any gradient is formed: an autograd pass can end with FSDP
    freeing the gathered layers of the stage (``reshard_after_forward``) and registering their shards, while
    the gradients belong to the gathered parameters, which FSDP reduces."""
    if rec.grads is None:
        raise RuntimeError("W before I: no saved gradients")
    grads = iter(rec.grads)
    work = [(outs, x, [next(grads) for _ in outs], dict(module._parameters)) for module, outs, x in rec.outputs]
    for outs, x, gs, own in work:
        if x is not None:
            if gs[0] is not None:
                _linear_weight_grad(own["weight"], own.get("bias"), x, gs[0])
            continue
        params = [p for p in own.values() if p is not None and p.requires_grad]
        pairs = [(t, g) for t, g in zip(outs, gs) if g is not None]
        if not pairs or not params:
            continue
        dws = torch.autograd.grad([t for t, _ in pairs], params, [g for _, g in pairs],
                                  retain_graph=True, allow_unused=True)
        for p, dw in zip(params, dws):
            _accumulate(p, dw)
    rec.outputs, rec.grads = [], None


def _linear_weight_grad(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, g: torch.Tensor) -> None:
    """dW = g^T x, as autograd forms it: under autocast the product runs in the output's dtype (bf16) with the
    input cast to it, and the result is cast to the parameter's dtype (an fp32 master weight)."""
    g2 = g.reshape(-1, g.shape[-1])
    x2 = x.detach().reshape(-1, x.shape[-1]).to(g2.dtype)
    _accumulate(weight, g2.t().mm(x2).to(weight.dtype))
    if bias is not None and bias.requires_grad:
        _accumulate(bias, g2.sum(0).to(bias.dtype))


def _accumulate(p: torch.Tensor, dw: torch.Tensor | None) -> None:
    if dw is not None:
        p.grad = dw if p.grad is None else p.grad.add_(dw)


def _tensors(output):
    if isinstance(output, torch.Tensor):
        return (output,)
    if isinstance(output, (tuple, list)):
        return tuple(t for t in output if isinstance(t, torch.Tensor))
    return ()
