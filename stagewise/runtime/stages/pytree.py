"""What crosses a stage boundary: a pytree of tensors (tuple, list, dict and its subclasses such as
OrderedDict, dataclass (transformers' ModelOutput), NamedTuple, SimpleNamespace).

``flatten`` turns a tree into its leaves and a *spec* (a small picklable value
that rebuilds the tree with ``unflatten``); ``paths`` names each leaf the way a
user would index it (``[1]``, ``['mask']``, ``.hidden``) for messages. Anything
that is not a container is a leaf: tensors travel as messages, other leaves
(None, numbers, strings) ride in the header. ``split`` cuts a step's batch into
micro-batches along dimension 0, leaf by leaf.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, Callable

import torch

from ..config import RunError

LEAF = None  #: the spec of a leaf


def flatten(tree) -> tuple[list, Any]:
    """(leaves in order, spec)."""
    leaves: list = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves: list):
    if isinstance(tree, tuple) and hasattr(type(tree), "_fields"):  # NamedTuple
        return ("namedtuple", type(tree), tuple(_flatten(x, leaves) for x in tree))
    if type(tree) in (tuple, list):
        return (type(tree).__name__, tuple(_flatten(x, leaves) for x in tree))
    if type(tree) is dict:
        keys = tuple(tree)
        return ("dict", keys, tuple(_flatten(tree[k], leaves) for k in keys))
    if isinstance(tree, SimpleNamespace):
        keys = tuple(vars(tree))
        return ("namespace", keys, tuple(_flatten(getattr(tree, k), leaves) for k in keys))
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        names = tuple(f.name for f in dataclasses.fields(tree) if f.init)
        return ("dataclass", type(tree), names, tuple(_flatten(getattr(tree, n), leaves) for n in names))
    if isinstance(tree, Mapping):  # OrderedDict and other mappings: rebuilt as their own type from pairs
        keys = tuple(tree)
        return ("mapping", type(tree), keys, tuple(_flatten(tree[k], leaves) for k in keys))
    leaves.append(tree)
    return LEAF


def unflatten(spec, leaves) -> Any:
    """The tree of ``spec`` with ``leaves`` in order."""
    it = iter(leaves)
    return _build(spec, it)


def _build(spec, it):
    if spec is LEAF:
        return next(it)
    kind = spec[0]
    if kind == "tuple":
        return tuple(_build(s, it) for s in spec[1])
    if kind == "list":
        return [_build(s, it) for s in spec[1]]
    if kind == "namedtuple":
        return spec[1](*(_build(s, it) for s in spec[2]))
    if kind == "dict":
        return {k: _build(s, it) for k, s in zip(spec[1], spec[2])}
    if kind == "namespace":
        return SimpleNamespace(**{k: _build(s, it) for k, s in zip(spec[1], spec[2])})
    if kind == "mapping":
        return spec[1]((k, _build(s, it)) for k, s in zip(spec[2], spec[3]))
    return spec[1](**{n: _build(s, it) for n, s in zip(spec[2], spec[3])})


def paths(spec) -> list[str]:
    """Each leaf's path (``[0]``, ``['mask']``, ``.hidden``; ``''`` for a bare tensor)."""
    out: list[str] = []
    _paths(spec, "", out)
    return out


def _paths(spec, prefix: str, out: list) -> None:
    if spec is LEAF:
        out.append(prefix)
        return
    kind = spec[0]
    if kind in ("tuple", "list"):
        for k, s in enumerate(spec[1]):
            _paths(s, f"{prefix}[{k}]", out)
    elif kind == "namedtuple":
        for name, s in zip(spec[1]._fields, spec[2]):
            _paths(s, f"{prefix}.{name}", out)
    elif kind == "dict":
        for key, s in zip(spec[1], spec[2]):
            _paths(s, f"{prefix}[{key!r}]", out)
    elif kind == "mapping":
        for key, s in zip(spec[2], spec[3]):
            _paths(s, f"{prefix}[{key!r}]", out)
    elif kind == "namespace":
        for key, s in zip(spec[1], spec[2]):
            _paths(s, f"{prefix}.{key}", out)
    else:
        for name, s in zip(spec[2], spec[3]):
            _paths(s, f"{prefix}.{name}", out)


def describe(spec) -> str:
    """A short text of a tree's structure, for messages: ``tuple(2)``, ``dict('h', 'mask')``."""
    if spec is LEAF:
        return "a tensor"
    kind = spec[0]
    if kind in ("tuple", "list"):
        return f"{kind} of {len(spec[1])}"
    if kind == "dict":
        return f"dict with keys {', '.join(map(repr, spec[1]))}"
    if kind == "mapping":
        return f"{spec[1].__name__} with keys {', '.join(map(repr, spec[2]))}"
    if kind == "namespace":
        return f"SimpleNamespace with {', '.join(spec[1])}"
    return f"{spec[1].__name__}"


def tensors(tree) -> list[torch.Tensor]:
    """The tensor leaves of ``tree``."""
    return [x for x in flatten(tree)[0] if isinstance(x, torch.Tensor)]


def map_tensors(fn: Callable, tree):
    """``tree`` with ``fn`` applied to each tensor leaf."""
    leaves, spec = flatten(tree)
    return unflatten(spec, [fn(x) if isinstance(x, torch.Tensor) else x for x in leaves])


def needs_grad(t: torch.Tensor) -> bool:
    """A leaf that carries a gradient across a boundary: floating and requiring one."""
    return t.requires_grad and (t.is_floating_point() or t.is_complex())


def detached(tree):
    """A copy of ``tree`` whose tensor leaves are new autograd leaves: each floating leaf that needed a
    gradient needs one again (an integer mask or position ids never do)."""
    return map_tensors(lambda t: t.detach().requires_grad_(needs_grad(t)), tree)


def grad_leaves(tree) -> list[torch.Tensor]:
    """The leaves whose gradients go back across the boundary, in order."""
    return [t for t in tensors(tree) if needs_grad(t)]


def split(tree, parts: int, what: str) -> list:
    """``tree`` cut into ``parts`` equal pieces along dimension 0 of each tensor leaf (other leaves copied).

    ``what`` names the argument in the message (``inputs``, ``targets``).
    """
    leaves, spec = flatten(tree)
    names = paths(spec)
    cols = []
    for leaf, name in zip(leaves, names):
        if not isinstance(leaf, torch.Tensor):
            cols.append([leaf] * parts)
            continue
        rows = leaf.shape[0] if leaf.dim() else 0
        if rows % parts or rows == 0:
            raise RunError(f"{what}{name} has {rows} rows (dimension 0 of shape {tuple(leaf.shape)}); it must split "
                           f"into {parts} equal micro-batches: use a batch size that is a multiple of {parts}")
        cols.append(leaf.chunk(parts))  # views; the executor never writes into an input
    return [unflatten(spec, [c[k] for c in cols]) for k in range(parts)]
