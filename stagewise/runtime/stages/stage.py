"""Cut a layer sequence into the schedule's stages and place them on ranks.

Partition (layers -> stages of one model copy) and placement (stages -> ranks,
from the schedule) stay separate. A schedule with several lanes (DualPipe)
holds one model copy per lane: lane stage ``lo + k`` holds the layers of
partition piece ``k``. Every stage gets its own copy of its layers, so a weight
shared by two layers (a tied embedding and head) or held by two lanes becomes
several *replicas* of one logical parameter; their gradients are summed at
step end (``replicas.py``) so they stay equal.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from torch import nn

from ...schedule import Schedule
from ..config import RunError
from . import rng


def partition(num_layers: int, stages: int, split=None) -> tuple[range, ...]:
    """Layer ranges of ``stages`` stages: even (earlier stages get the extra layers) or ``split`` (a ``Split`` or
    its counts)."""
    from ...split import Split

    if stages > num_layers:
        raise RunError(f"the model has {num_layers} layers but the schedule needs {stages} stages per model copy; "
                       "each stage needs at least one layer (use a model with more layers, or fewer `ranks` or "
                       "`chunks`)")
    if split is None:
        return Split.even(num_layers, stages).ranges
    split = list(split.counts if isinstance(split, Split) else split)
    if len(split) != stages:
        raise RunError(f"`split` has {len(split)} counts; the schedule has {stages} stages per model copy")
    if any(c < 1 for c in split):
        raise RunError(f"`split` {_csv(split)}: every stage needs at least one layer")
    if sum(split) != num_layers:
        what = "loses" if sum(split) < num_layers else "duplicates or invents"
        raise RunError(f"`split` {_csv(split)} covers {sum(split)} layers; the model has {num_layers}, so the split "
                       f"{what} layers; the counts must add up to {num_layers}")
    return Split(tuple(split)).ranges


def check_cover(ranges: Sequence[range], num_layers: int) -> None:
    """Explicit layer ranges must cover 0..num_layers-1 once each, in order."""
    where: dict[int, int] = {}
    for s, rg in enumerate(ranges):
        if len(rg) == 0:
            raise RunError(f"stage {s} holds no layer")
        for layer in rg:
            if layer in where:
                raise RunError(f"layer {layer} is in stages {where[layer]} and {s}; a split must not duplicate a layer")
            if not 0 <= layer < num_layers:
                raise RunError(f"stage {s} names layer {layer}; the model has layers 0..{num_layers - 1}")
            where[layer] = s
    lost = [k for k in range(num_layers) if k not in where]
    if lost:
        raise RunError(f"layer {lost[0]} is in no stage; a split must not lose a layer")
    if [layer for rg in ranges for layer in rg] != list(range(num_layers)):
        raise RunError("stages must hold the layers in model order")


class Holder(NamedTuple):
    """One copy of a parameter: layer ``layer``'s parameter ``name`` inside stage ``stage``."""

    stage: int
    layer: int
    name: str


@dataclass(frozen=True, kw_only=True)
class Replica:
    """A logical parameter held several times (tied or duplicated); kept equal across ``ranks``."""

    name: str  #: "layer.param" of its first occurrence in the model
    holders: tuple[Holder, ...]
    ranks: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class StageMap:
    """Layers of every stage and the holders of every parameter (not a *layout*: that is a split's text)."""

    ranges: tuple[range, ...]  #: per stage of the schedule
    params: dict  #: logical name -> tuple of Holders (every parameter, one or more copies)
    replicas: tuple[Replica, ...]  #: the logical parameters with more than one copy


def stage_map(schedule: Schedule, layers: Sequence[nn.Module], split: Sequence[int] | None = None) -> StageMap:
    """Layer ranges per stage and the holders of each logical parameter."""
    return stage_map_of(schedule, stage_ranges(schedule, len(layers), split), logical_names(layers))


def stage_ranges(schedule: Schedule, num_layers: int, split: Sequence[int] | None = None) -> tuple[range, ...]:
    """Per stage of the schedule, its layers: each lane holds one whole model copy cut by ``split``."""
    sizes = {lane.stage_hi - lane.stage_lo for lane in schedule.lanes}
    if len(sizes) != 1:
        raise RunError(f"lanes of unequal length {sorted(sizes)}; every lane must hold one whole model copy")
    pieces = partition(num_layers, schedule.stages_per_copy, split)
    return tuple(pieces[s - first] for s, first in enumerate(schedule.first_stages))


def stage_map_of(schedule: Schedule, ranges: Sequence[range], uses: Sequence[Sequence[tuple[str, str]]]) -> StageMap:
    """The stage map from per-stage layer ranges and, per layer, its (parameter name, logical name) pairs."""
    params: dict[str, list[Holder]] = {}
    for s, rg in enumerate(ranges):
        for layer in rg:
            for name, logical in uses[layer]:
                params.setdefault(logical, []).append(Holder(s, layer, name))
    replicas = tuple(
        Replica(name=n, holders=tuple(h), ranks=tuple(sorted({schedule.placement[x.stage] for x in h})))
        for n, h in params.items() if len(h) > 1
    )
    return StageMap(ranges=tuple(ranges), params={n: tuple(h) for n, h in params.items()}, replicas=replicas)


def logical_names(layers: Sequence[nn.Module]) -> list[list[tuple[str, str]]]:
    """Per layer, (parameter name, logical name); a weight shared by layers has one logical name."""
    first: dict[int, str] = {}
    out = []
    for i, layer in enumerate(layers):
        out.append([(name, first.setdefault(id(p), f"{i}.{name}")) for name, p in layer.named_parameters()])
    return out


class Stage(nn.Module):
    """The layers of one stage, run in order on one tensor."""

    def __init__(self, index: int, layers: Sequence[nn.Module], first_layer: int):
        super().__init__()
        self.index = index
        self.first_layer = first_layer
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for k, layer in enumerate(self.layers):
            rng.enter_layer(self.first_layer + k)  # dropout keyed by the layer, not by where it runs (rng.py)
            x = layer(x)
        return x

    def param(self, holder: Holder) -> nn.Parameter:
        return self.layers[holder.layer - self.first_layer].get_parameter(holder.name)


def build_stages(schedule: Schedule, lay: StageMap, layers: Sequence[nn.Module], rank: int, device) -> dict[int, Stage]:
    """This rank's stages, each with its own copy of its layers (ties become replicas)."""
    return {
        s: Stage(s, [copy.deepcopy(layers[i]) for i in lay.ranges[s]], lay.ranges[s].start).to(device)
        for s in schedule.stages_of_rank(rank)
    }


def _csv(xs) -> str:
    return ",".join(map(str, xs))
