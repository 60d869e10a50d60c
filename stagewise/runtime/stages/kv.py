"""Sequence slices at run time (Seq1F1B): the keys and values a slice attends to, carried from the slices before it.

With ``Schedule.slices = k`` a micro-batch is cut into ``k`` slices along dimension 1 of every input and target
leaf (``cut``), and each slice runs as its own pipeline unit (``stagewise.slices``). On a stage, slice j's
forward attends to the keys and values of slices 0..j-1 of its micro-batch; the model asks for them with one
call in its attention (the protocol a causal model implements, docs/api.md):

    k, v = stagewise.kv.extend(k, v)              # earlier slices' keys and values prepended (dim -2)
    mask = stagewise.kv.causal_mask(q.shape[-2], k.shape[-2], q.device)   # None without a prefix
    pos = torch.arange(T) + stagewise.kv.offset() # positions of this slice's tokens

Outside a sliced forward ``extend`` returns its arguments, ``offset`` is 0 and ``causal_mask`` None: the same
model runs unsliced unchanged.

The backward stays exact and per slice (the Seq1F1B way): slice j's forward sees each earlier slice's tensors as
DETACHED leaves that require grad, so its backward ends at them; their gradients are summed (``Carry.hand_back``)
and join slice i's own backward as extra (tensor, gradient) pairs (``Carry.extra``), which the schedule runs after
every later slice's backward. The i-th ``extend`` call of a slice pairs with the i-th of every earlier slice, so
a model calls it the same number of times in every slice (a fixed layer sequence does).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from ..config import RunError
from . import pytree


@dataclass(kw_only=True)
class Carry:
    """One (stage, micro-batch)'s carried tensors across its slices. Mutable: filled by forwards, emptied by
    backwards (slice j's entries go once its backward ran: every later slice's forward and backward ran before)."""

    kept: dict = field(default_factory=dict)  #: slice -> the tensors its forward gave ``extend``, in call order
    leaves: dict = field(default_factory=dict)  #: slice j -> the leaves standing in j's forward for (i, call)
    grads: dict = field(default_factory=dict)  #: slice i -> call -> summed gradient later slices handed back

    def leaves_of(self, j: int) -> list:
        """Slice j's stand-in leaves (what its backward differentiates, besides its input), flat."""
        return [leaf for _, _, leaf in self.leaves.get(j, ())]

    def hand_back(self, j: int, grads) -> None:
        """Slice j's backward gave ``grads`` (aligned with ``leaves_of(j)``): summed into the earlier slices'."""
        for (i, c, _), g in zip(self.leaves.get(j, ()), grads):
            if g is not None:
                mine = self.grads.setdefault(i, {})
                mine[c] = g if c not in mine else mine[c] + g

    def extra(self, j: int) -> tuple[list, list]:
        """(tensors, gradients) slice j's backward adds to its roots: its carried tensors' gradients from the
        later slices."""
        got = self.grads.get(j, {})
        pairs = [(t, got[c]) for c, t in enumerate(self.kept.get(j, ())) if c in got and t.requires_grad]
        return [t for t, _ in pairs], [g for _, g in pairs]

    def done(self, j: int) -> bool:
        """Slice j's backward ran: drop what it held; True when the micro-batch's carry is empty (slice 0)."""
        for table in (self.kept, self.leaves, self.grads):
            table.pop(j, None)
        return j == 0


@dataclass(frozen=True)
class _Running:
    carry: Carry
    j: int
    length: int  #: this slice's tokens (every slice has as many)
    grad: bool  #: build stand-in leaves that take gradients (training)
    calls: list  #: the next call index (a one-element counter)


_NOW: ContextVar[_Running | None] = ContextVar("stagewise_slice", default=None)


@contextmanager
def running(carry: Carry, j: int, length: int, grad: bool):
    """Run slice ``j`` of a micro-batch (``length`` tokens) whose earlier slices' tensors ``carry`` holds."""
    carry.kept[j], carry.leaves[j] = [], []
    token = _NOW.set(_Running(carry, j, length, grad, [0]))
    try:
        yield
    finally:
        _NOW.reset(token)


def sliced() -> bool:
    """A sliced forward is running (its model's ``extend`` calls carry keys and values)."""
    return _NOW.get() is not None


def offset() -> int:
    """Position of the running slice's first token in its sequence (0 outside a sliced forward)."""
    now = _NOW.get()
    return 0 if now is None else now.j * now.length


def extend(*tensors: torch.Tensor, dim: int = -2):
    """Each tensor with the earlier slices' tensors of the same call prepended along ``dim`` (keys and values
    laid out (batch, heads, tokens, head_dim): -2). One tensor in, one out; several, a tuple. Outside a sliced
    forward: the tensors as given."""
    now = _NOW.get()
    if now is None or not tensors:
        return tensors[0] if len(tensors) == 1 else tensors
    carry, j = now.carry, now.j
    out = []
    for t in tensors:
        c = now.calls[0]
        now.calls[0] += 1
        prior = []
        for i in range(j):
            earlier = carry.kept.get(i, [])
            if c >= len(earlier):
                raise RunError(f"slice {j}'s forward calls stagewise.kv.extend with more tensors ({c + 1}) than "
                               f"slice {i}'s did ({len(earlier)}); a model extends the same tensors in every slice")
            leaf = earlier[c].detach()
            if now.grad and earlier[c].requires_grad:
                leaf.requires_grad_(True)
                carry.leaves[j].append((i, c, leaf))
            prior.append(leaf)
        carry.kept[j].append(t)
        out.append(torch.cat([*prior, t], dim=dim) if prior else t)
    return out[0] if len(out) == 1 else tuple(out)


def causal_mask(q_len: int, k_len: int, device=None, window: int | None = None) -> torch.Tensor | None:
    """The causal mask of ``q_len`` queries, the last of ``k_len`` keys (True: attends), or None when there is
    no prefix (``q_len == k_len``: use the kernel's own causal flag). ``window``: a sliding window's size."""
    if k_len == q_len:
        return None
    q = torch.arange(k_len - q_len, k_len, device=device).unsqueeze(1)
    key = torch.arange(k_len, device=device).unsqueeze(0)
    seen = key <= q
    return seen & (key > q - window) if window is not None else seen


def cut(tree, k: int, what: str) -> list:
    """``tree`` (one micro-batch) cut into ``k`` equal slices along dimension 1 of every tensor leaf."""
    leaves, spec = pytree.flatten(tree)
    names = pytree.paths(spec)
    cols = []
    for leaf, name in zip(leaves, names):
        if not isinstance(leaf, torch.Tensor):
            cols.append([leaf] * k)
            continue
        tokens = leaf.shape[1] if leaf.dim() > 1 else None
        if tokens is None or tokens % k:
            shape = tuple(leaf.shape)
            rule = (f"has {tokens} tokens (dimension 1 of shape {shape}); it must cut into {k} equal sequence "
                    f"slices: use a sequence length that is a multiple of {k}") if tokens is not None else \
                   f"has shape {shape}; sequence slices cut dimension 1 of every tensor, so it needs two or more"
            raise RunError(f"`slices` {k}: {what}{name} {rule}")
        cols.append(leaf.chunk(k, dim=1))
    return [pytree.unflatten(spec, [c[j] for c in cols]) for j in range(k)]


def join(trees: list):
    """A micro-batch's slice outputs joined back along dimension 1, leaf by leaf (a scalar leaf: the first)."""
    leaves = [pytree.flatten(t)[0] for t in trees]
    spec = pytree.flatten(trees[0])[1]
    cols = [torch.cat(col, dim=1) if isinstance(col[0], torch.Tensor) and col[0].dim() > 1 else col[0]
            for col in zip(*leaves)]
    return pytree.unflatten(spec, cols)


def slice_length(x) -> int:
    """Tokens of a slice: dimension 1 of its first tensor leaf of two or more dimensions (0 when none)."""
    return next((int(t.shape[1]) for t in pytree.tensors(x) if t.dim() > 1), 0)
