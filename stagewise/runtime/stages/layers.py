"""A model as the pipeline sees it: a sequence of layers, built on demand, with their original names.

``Layers`` is the one model interface of the runtime: how many layers, how to
build layer ``i`` (called on a rank only for the layers of its own stages),
each layer's prefix in the original model's ``state_dict`` and the groups of
parameter names that are one tied parameter. ``as_layers`` turns what a user
passes into one:

- a sequence of modules (``nn.Sequential``, a list): names ``0``, ``1``...,
  ties found by identity (the same ``nn.Parameter`` in two layers);
- a ``Layers`` value (a factory: DeepSpeed's ``LayerSpec``; what adapters give);
- any ``nn.Module`` with split points: its children in order (a ``ModuleList``
  expanded into its items) are the layers, and its forward must be
  those layers applied in turn. Built on the meta device (``torch.device("meta")``),
  a rank materializes only its own layers (``to_empty``, then ``reset_parameters``
  of each submodule, or ``init``); so does a sequence of meta-device modules.

Each layer takes one argument, the previous layer's output (a tensor or any
pytree), and returns the next one; the first layer gets a micro-batch of the
inputs and the loss function gets the last layer's output.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from torch import nn

from ... import limits
from ..config import RunError
from .stage import Stage


@dataclass(frozen=True)
class Layers:
    """A model as ``count`` layers; ``build(i)`` makes layer ``i`` (called only for the rank's own layers).

    Example::

        def build(i):
            return nn.Linear(64, 64) if i < 7 else nn.Linear(64, 10)
        model = stagewise.Layers(8, build)          # or Layers(count=8, build=build)
    """

    count: int  #: layers in the model
    build: Callable[[int], nn.Module]  #: layer i, a new module (or one the caller keeps: see ``shared``)
    #: each layer's prefix in the original state_dict; default "0", "1", ...
    names: tuple[str, ...] | None = field(default=None, kw_only=True)
    #: groups of full parameter names that are one parameter
    ties: tuple[tuple[str, ...], ...] = field(default=(), kw_only=True)
    #: layers per stage of one model copy, when the model says (split points)
    split: tuple[int, ...] | None = field(default=None, kw_only=True)
    #: the model's tensor-parallel plan (module-name patterns -> styles, parallel/tp.py), used when `tp` > 1
    tp_plan: dict | None = field(default=None, kw_only=True, hash=False, compare=False)
    #: sizes tensor parallel splits, which `tp` must divide: (("attention heads", 8), ...)
    tp_divides: tuple[tuple[str, int], ...] = field(default=(), kw_only=True)

    @classmethod
    def from_modules(cls, named: Sequence[tuple[str, nn.Module]], ties: Sequence[Sequence[str]] = ()) -> "Layers":
        """Layers from (name, module) pairs already built (an adapter's view of a model): a parameter object
        used by two of them is a tie, besides ``ties``. Example::

            Layers.from_modules([("embed", emb), ("blocks.0", b0), ("head", head)])
        """
        named = list(named)
        mods = [m for _, m in named]
        return cls(count=len(named), build=mods.__getitem__, names=tuple(n for n, _ in named),
                   ties=identity_ties(named) + tuple(tuple(g) for g in ties))

    def prefix(self, i: int) -> str:
        return self.names[i] if self.names is not None else str(i)

    def all_names(self) -> list[str]:
        return [self.prefix(i) for i in range(self.count)]

    def check(self) -> None:
        """The count, names and ties, before any layer is built (``RunError`` naming the rule)."""
        if not isinstance(self.count, int) or isinstance(self.count, bool):
            raise RunError(f"Layers `count` must be a whole number; got {self.count!r}")
        if self.count < 1:
            raise RunError(f"the model has {self.count} layers; it needs at least one")
        limits.LAYERS.check(self.count, "Layers `count`")
        if not callable(self.build):
            raise RunError(f"Layers `build` must be a function of the layer index; got {type(self.build).__name__}")
        if self.names is not None:
            if len(self.names) != self.count:
                raise RunError(f"Layers `names` has {len(self.names)} names for {self.count} layers")
            twice = next((n for n, k in Counter(self.names).items() if k > 1), None)
            if twice is not None:
                raise RunError(f"Layers `names` gives {twice!r} to two layers; each layer needs its own prefix")

    def build_all(self) -> list[nn.Module]:
        """Every layer, in one process, each tie one shared Parameter: the unpipelined model (the reference,
        a profile), as ``nn.Sequential(*layers.build_all())`` would be written by hand."""
        built = [self.make(i) for i in range(self.count)]
        prefixes = {self.prefix(i): i for i in range(self.count)}
        for group in self.ties:
            owners = [_owner(full, prefixes, built) for full in group]
            (_, _, first), rest = owners[0], owners[1:]
            for module, attr, p in rest:
                if p.shape != first.shape:
                    raise RunError(f"ties: {group[0]!r} has shape {tuple(first.shape)} and the parameter tied to it "
                                   f"has {tuple(p.shape)}; tied parameters must have one shape")
                setattr(module, attr, first)
        return built

    def make(self, i: int) -> nn.Module:
        """Layer ``i``, checked to be a module."""
        m = self.build(i)
        if not isinstance(m, nn.Module):
            raise RunError(f"the layer factory returned {type(m).__name__} for layer {i}; it must return an "
                           "nn.Module (wrap a function in a module whose forward calls it)")
        return m


def as_layers(model, split=None, init: Callable | None = None, device=None) -> Layers:
    """The ``Layers`` of what a user passed as the model (see the module docstring); ``split`` as given to
    ``Pipeline``: counts, the planner's layout text (``E+t*7 | t*8``) or, for a module, module names."""
    if isinstance(model, Layers):
        return model
    if isinstance(model, nn.Sequential) or (isinstance(model, Sequence) and not isinstance(model, nn.Module)):
        layers = list(model)
        bad = next((k for k, m in enumerate(layers) if not isinstance(m, nn.Module)), None)
        if bad is not None:
            raise RunError(f"layer {bad} of the model is a {type(layers[bad]).__name__}; every layer must be an "
                           "nn.Module")
        out = Layers.from_modules([(str(k), m) for k, m in enumerate(layers)])
        if any(p.is_meta for m in layers for p in m.parameters()):  # made real as a module's layers are
            out = dataclasses.replace(out, build=lambda i: materialize(copy.deepcopy(layers[i]), str(i), init, device))
        return out
    if isinstance(model, nn.Module):
        return _module_layers(model, split, init, device)
    if callable(model):
        raise RunError("a layer factory needs its number of layers: pass stagewise.Layers(count=N, build=fn)")
    raise RunError(f"the model is a {type(model).__name__}; pass a sequence of layers, stagewise.Layers(count, "
                   "build) or an nn.Module with split points")


def _module_layers(model: nn.Module, split, init, device) -> Layers:
    named = flat_layers(model)
    loose = [n for n, _ in model.named_parameters(recurse=False)]
    if loose:
        raise RunError(f"the model has parameter {loose[0]!r} outside its layers; move it into a layer module")
    if split is None:
        raise RunError(f"{type(model).__name__} is an nn.Module without split points: pass split= as the names of the "
                       f"modules that start stages 1, 2, ... (its layers are {_some([n for n, _ in named])}), as "
                       "layers per stage (4,4), or as a layout ('E+t*3 | t*4'); or pass a sequence of layers")
    names = tuple(n for n, _ in named)
    counts = split_counts(split, names)
    meta = any(p.is_meta for p in model.parameters())

    def build(i: int) -> nn.Module:
        m = named[i][1]
        return materialize(copy.deepcopy(m), names[i], init, device) if meta else m

    return Layers(count=len(named), build=build, names=names, ties=identity_ties(named), split=counts)


def build_own_stages(spec: Layers, ranges, mine: list[int], device) -> tuple[dict[int, Stage], tuple[int, ...]]:
    """This rank's stages, and the layers it built (each asked of the factory once, only these). A second use
    of a layer (DualPipe's other lane) is a copy, and so is a layer sharing a parameter with one already placed
    here (a tie becomes two copies summed at step end)."""
    built: dict[int, nn.Module] = {}
    seen: set[int] = set()
    stages = {}
    for s in mine:
        mods = []
        for i in ranges[s]:
            if i in built:
                m = copy.deepcopy(built[i])
            else:
                m = spec.make(i)
                if any(id(p) in seen for p in m.parameters()):
                    m = copy.deepcopy(m)
                built[i] = m
            seen.update(id(p) for p in m.parameters())
            mods.append(m)
        stages[s] = Stage(s, mods, ranges[s].start).to(device)
    return stages, tuple(sorted(built))



def flat_layers(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    """(name, module) of the model's layers in order: its children, each ModuleList expanded into its items."""
    out = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            out += flat_layers(child, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", child))
    return out


def split_counts(split, names: Sequence[str]) -> tuple[int, ...] | None:
    """Layers per stage from a ``Split``, counts, layout text (``E+t*7 | t*8``), or the names of the layers
    starting stages."""
    from ...split import LayoutError, Split

    if split is None:
        return None
    if isinstance(split, Split):
        return split.counts
    if isinstance(split, str):
        try:
            return Split.parse(split, len(names)).counts
        except LayoutError as e:
            raise RunError(f"split {split!r}: {e}") from None
    split = list(split)
    if all(isinstance(c, int) for c in split):
        return tuple(split)
    where = {n: k for k, n in enumerate(names)}
    starts = []
    for n in split:
        if n not in where:
            raise RunError(f"split point {n!r} is not a layer of the model; its layers are {_some(list(names))}")
        starts.append(where[n])
    if starts != sorted(set(starts)) or starts[0] == 0:
        raise RunError(f"split points {split} must name layers after the first, in model order, each once")
    bounds = [0, *starts, len(names)]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def identity_ties(named: Sequence[tuple[str, nn.Module]]) -> tuple[tuple[str, ...], ...]:
    """Groups of full parameter names that are one ``nn.Parameter`` object (a tied embedding and head)."""
    groups: dict[int, list[str]] = {}
    for prefix, layer in named:
        for pname, p in layer.named_parameters(remove_duplicate=False):
            groups.setdefault(id(p), []).append(f"{prefix}.{pname}")
    return tuple(tuple(dict.fromkeys(g)) for g in groups.values() if len(set(g)) > 1)


def materialize(module: nn.Module, name: str, init: Callable | None, device) -> nn.Module:
    """A meta-device layer made real on ``device``, every parameter and buffer initialised: each submodule's
    ``reset_parameters`` (which initialises that submodule's own tensors), then ``init(path, submodule)``
    for each submodule whose own tensors nothing reset yet (a bare ``nn.Parameter``, a buffer computed in
    ``__init__``); a tensor still left is an error naming it, never uninitialised memory."""
    module = module.to_empty(device=device or "cpu")
    left = []  # (path, submodule) whose own parameters or buffers nothing has initialised
    for path, sub in module.named_modules():
        own = [n for n, t in [*sub._parameters.items(), *sub._buffers.items()] if t is not None]
        reset = getattr(sub, "reset_parameters", None)
        if callable(reset):
            reset()
        elif own:
            left.append((path, sub, own))
    for path, sub, own in left:
        full = f"{name}.{path}" if path else name
        if init is None:
            raise RunError(f"layer {name!r} built on the meta device: {full}.{own[0]} is initialised by no "
                           f"reset_parameters (a bare nn.Parameter or a buffer made in __init__); pass "
                           f"init=fn(name, module), called for {full!r}, or build the model off the meta device")
        init(full, sub)
    return module


def _some(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f", ... {names[-1]}" if len(names) > 4 else "")


def _owner(full: str, prefixes: dict[str, int], built: list[nn.Module]):
    """(module holding it, its attribute name, the Parameter) of a full parameter name ``prefix.path.name``."""
    parts = full.split(".")
    for k in range(len(parts) - 1, 0, -1):
        i = prefixes.get(".".join(parts[:k]))
        if i is None:
            continue
        *path, attr = parts[k:]
        try:
            module = built[i].get_submodule(".".join(path))
            return module, attr, module.get_parameter(attr)
        except AttributeError:
            continue
    raise RunError(f"ties: {full!r} is not a parameter of the model")
