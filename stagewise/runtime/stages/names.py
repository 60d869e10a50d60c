"""Parameter names end to end: the whole pipeline's stage map, ties by name, state_dicts keyed by original names.

Each rank builds only its own layers, so it learns every other layer's
parameter names in one ``all_gather_object``; then every rank holds the same
``StageMap`` (and makes the same process groups for tied copies). Logical names
stay ``layer.param`` (``3.fc.weight``: what the layer-keyed checkpoints use);
``Layers.names`` maps them to the original model's (``blocks.2.fc.weight``).
A tie group's logical name is its first member in model order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ...schedule import Schedule
from ..run.config import RunError
from .layers import Layers
from .stage import StageMap, Stage, stage_map_of


def gather_stage_map(sched: Schedule, spec: Layers, ranges, stages: dict[int, Stage], ties,
                     ranks: tuple[int, ...] | None = None) -> StageMap:
    """The stage map of the whole pipeline from every rank's parameter names (a collective over every rank).

    ``ranks``: the global ranks of this rank's pipeline, whose names make the map (default: every rank's; an
    expert-parallel pipeline holds its own share of the experts, so each pipeline maps its own)."""
    mine = {}
    for st in stages.values():
        for k, layer in enumerate(st.layers):
            mine[st.first_layer + k] = [(n, tuple(p.shape)) for n, p in layer.named_parameters()]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if ranks is not None:
        gathered = [gathered[r] for r in ranks]
    shapes: dict[tuple[int, str], tuple] = {}
    names: dict[int, list[str]] = {}
    for part in gathered:
        for i, pairs in part.items():
            names[i] = [n for n, _ in pairs]
            shapes.update({(i, n): shape for n, shape in pairs})
    canon = _tie_map(spec, names, [*spec.ties, *map(tuple, ties)])
    _check_tie_shapes(spec, canon, shapes)  # on every rank alike, before any collective moves the copies
    uses = [[(n, canon.get((i, n), f"{i}.{n}")) for n in names.get(i, [])] for i in range(spec.count)]
    return stage_map_of(sched, ranges, uses)


class Names:
    """One rank's view of the model's names: its parameters and buffers under the original names.
    Immutable after construction (it reads the stages it is given)."""

    def __init__(self, spec: Layers, stage_map: StageMap, sched: Schedule, stages: dict[int, Stage], pipe_rank: int):
        self.spec, self.stage_map, self.sched, self.stages, self.pipe_rank = spec, stage_map, sched, stages, pipe_rank

    def original(self, logical: str) -> str:
        """``3.fc.weight`` (layer 3's ``fc.weight``) -> its name in the original model (``blocks.2.fc.weight``)."""
        layer, name = logical.split(".", 1)
        return f"{self.spec.prefix(int(layer))}.{name}"

    def all_of(self, holders) -> list[str]:
        """Every original name of a logical parameter (a tied one has several), in model order."""
        return list(dict.fromkeys(f"{self.spec.prefix(h.layer)}.{h.name}" for h in holders))

    def local(self, holders) -> list[nn.Parameter]:
        return [self.stages[h.stage].param(h) for h in holders if h.stage in self.stages]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's share: each name on the lowest pipeline rank holding it."""
        place, out = self.sched.placement, {}
        for holders in self.stage_map.params.values():
            if min(place[h.stage] for h in holders) == self.pipe_rank:
                value = self.local(holders)[0].detach()
                for name in self.all_of(holders):
                    out[name] = value
        for i, layer in self._owned_layers().items():
            for bname, buf in layer.named_buffers():
                if bname.rsplit(".", 1)[-1] not in _non_persistent(layer, bname):
                    out[f"{self.spec.prefix(i)}.{bname}"] = buf.detach()
        return out

    def load(self, state: dict[str, torch.Tensor], strict: bool, rank: int) -> None:
        """Copy this rank's parameters (every copy) and buffers from ``state``, keyed by original names."""
        missing = []
        with torch.no_grad():
            for logical, holders in self.stage_map.params.items():
                local = self.local(holders)
                key = next((n for n in self.all_of(holders) if n in state), None)
                if local and key is None:
                    missing.append(self.original(logical))
                for p in local if key is not None else ():
                    p.copy_(state[key])
            for st in self.stages.values():
                for k, layer in enumerate(st.layers):
                    for bname, buf in layer.named_buffers():
                        key = f"{self.spec.prefix(st.first_layer + k)}.{bname}"
                        if key in state:
                            buf.copy_(state[key])
        if strict and missing:
            raise RunError(f"load_state_dict: {len(missing)} parameters of rank {rank} are missing, e.g. "
                           f"{missing[0]!r}")

    def _owned_layers(self) -> dict[int, nn.Module]:
        """layer -> module, for the layers whose lowest holding rank is this one (their buffers are saved here)."""
        place, low = self.sched.placement, {}
        for s, rg in enumerate(self.stage_map.ranges):
            for i in rg:
                low[i] = min(low.get(i, place[s]), place[s])
        out = {}
        for _, st in sorted(self.stages.items()):
            for k, layer in enumerate(st.layers):
                i = st.first_layer + k
                if low[i] == self.pipe_rank and i not in out:
                    out[i] = layer
        return out


def _tie_map(spec: Layers, names: dict[int, list[str]], groups) -> dict[tuple[int, str], str]:
    """(layer, parameter) -> the logical name of its tie group (its first member in model order)."""
    prefixes = {spec.prefix(i): i for i in range(spec.count)}
    out = {}
    for group in groups:
        members = sorted(_resolve(full, prefixes, names) for full in group)
        first = f"{members[0][0]}.{members[0][1]}"
        for m in members:
            out[m] = first
    return out


def _check_tie_shapes(spec: Layers, canon: dict, shapes: dict) -> None:
    """Parameters tied into one must have one shape (``RunError`` naming both, on every rank)."""
    first_of: dict[str, tuple[int, str]] = {}
    for member, logical in sorted(canon.items()):
        first = first_of.setdefault(logical, member)
        if shapes[member] != shapes[first]:
            name = lambda m: f"{spec.prefix(m[0])}.{m[1]}"  # noqa: E731 - the original model's name
            raise RunError(f"ties: {name(first)!r} has shape {shapes[first]} and {name(member)!r} has "
                           f"{shapes[member]}; tied parameters must have one shape")


def _resolve(full: str, prefixes: dict[str, int], names: dict[int, list[str]]) -> tuple[int, str]:
    parts = full.split(".")
    for k in range(len(parts) - 1, 0, -1):
        i = prefixes.get(".".join(parts[:k]))
        if i is not None and ".".join(parts[k:]) in names.get(i, []):
            return i, ".".join(parts[k:])
    raise RunError(f"ties: {full!r} is not a parameter of the model (a name is a layer's prefix, then the "
                   f"parameter's name in that layer, e.g. {next(iter(prefixes))}.weight)")


def _non_persistent(layer: nn.Module, bname: str) -> set:
    owner = layer.get_submodule(bname.rsplit(".", 1)[0]) if "." in bname else layer
    return owner._non_persistent_buffers_set
