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
from ..config import RunError
from .layers import Layers
from .optim_checks import check_optimizer, check_state
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

    def parameters(self) -> list[nn.Parameter]:
        """Every parameter this rank holds (each copy): ``Pipeline.parameters()``."""
        return [p for st in self.stages.values() for p in st.parameters()]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and persistent buffer this rank holds, under each of its original names (a tied
        parameter under all of them; of two copies on this rank, the first): the union over the ranks is the
        whole model's. A sharded parameter (FSDP, tensor parallel) is its DTensor, as torch's own
        ``model.state_dict()`` gives it, so DCP saves and loads it in place (``dcp.load`` into this dict, then
        ``load``)."""
        out = {}
        for holders in self.stage_map.params.values():
            local = self.local(holders)
            if local:
                for name in self.all_of(holders):
                    out[name] = local[0].detach()
        return {**out, **self._buffers(self._layers(owned=False))}

    def owned_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's share: each name on the lowest pipeline rank holding it (the union over one pipeline's
        ranks is the whole model's, each tensor once: what an export writes)."""
        place, out = self.sched.placement, {}
        for holders in self.stage_map.params.values():
            if min(place[h.stage] for h in holders) == self.pipe_rank:
                value = self.local(holders)[0].detach()
                for name in self.all_of(holders):
                    out[name] = value
        return {**out, **self._buffers(self._layers(owned=True))}

    def load(self, state: dict[str, torch.Tensor], strict: bool, rank: int) -> None:
        """Copy this rank's parameters (every copy) and buffers from ``state``, keyed by original names: whole
        tensors (then each sharded parameter takes its own shard) or the DTensors of ``state_dict``."""
        missing = []
        with torch.no_grad():
            for logical, holders in self.stage_map.params.items():
                local = self.local(holders)
                key = next((n for n in self.all_of(holders) if n in state), None)
                if local and key is None:
                    missing.append(self.original(logical))
                for p in local if key is not None else ():
                    copy_into(p, state[key])
            for i, layer in self._layers(owned=False, copies=True):
                for bname, buf in layer.named_buffers():
                    key = f"{self.spec.prefix(i)}.{bname}"
                    if key in state:
                        buf.copy_(state[key])
        if strict and missing:
            raise RunError(f"load_state_dict: {len(missing)} parameters of rank {rank} are missing, e.g. "
                           f"{missing[0]!r}")

    def optimizer_state_dict(self, optimizer) -> dict:
        """The optimizer's state of this rank's parameters in DCP's flattened form, keyed by each logical
        parameter's original name (its first, for a tied one): ``state.NAME.KEY`` and
        ``param_groups.NAME.KEY`` (what ``torch.distributed.checkpoint.state_dict`` calls
        ``flatten_optimizer_state_dict``). The tensors are the optimizer's own (``dcp.load`` fills them in
        place); a ZeRO-1 optimizer gives its own partition's state. An optimizer without state yet is
        initialised first (a step with zero gradients and learning rate 0, as torch's ``get_state_dict``
        does), so that a load has tensors to fill."""
        check_optimizer(optimizer, self.parameters())
        init_state(optimizer)
        state, groups = _state_of(optimizer), _group_of(optimizer)
        out = {}
        for logical, holders in self.stage_map.params.items():
            local = self.local(holders)
            if not local:
                continue
            # the copy whose state this rank keeps: under ZeRO-1 a tie's copies (embedding and head on one
            # stage) may fall in different ranks' partitions, and each rank gives what it holds
            name, p = self.original(logical), next((q for q in local if state.get(q)), local[0])
            for k, v in state.get(p, {}).items():
                out[f"state.{name}.{k}"] = v
            for k, v in groups.get(id(p), {}).items():
                if k != "params":
                    out[f"param_groups.{name}.{k}"] = v
        return out

    def load_optimizer_state_dict(self, optimizer, state: dict, hyperparameters: bool = True) -> None:
        """Give every copy of each parameter here its state from ``state`` (``optimizer_state_dict``'s form);
        ``hyperparameters``: also the param groups' values (lr, betas...) stored with them."""
        check_optimizer(optimizer, self.parameters())
        init_state(optimizer)  # every state tensor exists, of its parameter's placement, to load into
        own, groups = _state_of(optimizer), _group_of(optimizer)
        mine = _owned_params(optimizer)
        expected = {}
        for logical, holders in self.stage_map.params.items():
            local = [p for p in self.local(holders) if id(p) in mine]
            if local and own.get(local[0]):
                expected[self.original(logical)] = own[local[0]]
        check_state(state, expected, {self.original(lg) for lg in self.stage_map.params},
                    type(getattr(optimizer, "optim", optimizer)).__name__)
        for logical, holders in self.stage_map.params.items():
            name = self.original(logical)
            prefix = f"state.{name}."
            saved = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            for p in self.local(holders):
                if saved and id(p) in mine:
                    own[p] = {k: _into(own.get(p, {}).get(k), v) for k, v in saved.items()}
                group = groups.get(id(p))
                if hyperparameters and group is not None:
                    for k in group:
                        v = state.get(f"param_groups.{name}.{k}")
                        if k != "params" and v is not None:
                            group[k] = v

    def _layers(self, owned: bool, copies: bool = False) -> list[tuple[int, nn.Module]]:
        """(layer, module) of the layers here: each once (the first copy), or only those whose lowest
        holding rank is this one (``owned``); ``copies``: every copy."""
        low = {}
        if owned:
            place = self.sched.placement
            for s, rg in enumerate(self.stage_map.ranges):
                for i in rg:
                    low[i] = min(low.get(i, place[s]), place[s])
        out, seen = [], set()
        for _, st in sorted(self.stages.items()):
            for k, layer in enumerate(st.layers):
                i = st.first_layer + k
                if (owned and low[i] != self.pipe_rank) or (i in seen and not copies):
                    continue
                seen.add(i)
                out.append((i, layer))
        return out

    def _buffers(self, layers) -> dict[str, torch.Tensor]:
        return {f"{self.spec.prefix(i)}.{bname}": buf.detach() for i, layer in layers
                for bname, buf in layer.named_buffers() if bname.rsplit(".", 1)[-1] not in _non_persistent(layer, bname)}

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


def copy_into(p: torch.Tensor, value: torch.Tensor) -> None:
    """``p.copy_(value)`` for a parameter that may be sharded: a whole tensor gives each rank its own shard
    (computed locally: every rank has the whole value), a DTensor of the same placement its local shard."""
    from ..dtensor import is_dtensor, local

    if not is_dtensor(p):
        p.copy_(value.full_tensor() if is_dtensor(value) else value)
        return
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(value, DTensor):
        value = value if value.placements == p.placements else value.redistribute(p.device_mesh, p.placements)
    else:
        value = distribute_tensor(value.to(p.device, p.dtype), p.device_mesh, p.placements, src_data_rank=None)
    local(p).copy_(local(value))


def init_state(optimizer) -> None:
    """Give a stateless optimizer its state: one step with zero gradients at learning rate 0 (what torch's
    ``get_state_dict`` does before a load; the parameters do not move)."""
    if _state_of(optimizer) or any(p.grad is not None for g in optimizer.param_groups for p in g["params"]):
        return
    for g in optimizer.param_groups:
        for p in g["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    lrs = [g.get("lr") for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        if "lr" in g:
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        if lr is not None:
            g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def _state_of(optimizer) -> dict:
    """The per-parameter state this rank keeps (ZeroRedundancyOptimizer: its partition's optimizer's)."""
    return getattr(optimizer, "optim", optimizer).state


def _owned_params(optimizer) -> set[int]:
    """ids of the parameters whose state this rank keeps (ZeRO-1: its partition)."""
    return {id(p) for g in getattr(optimizer, "optim", optimizer).param_groups for p in g["params"]}


def _group_of(optimizer) -> dict[int, dict]:
    return {id(p): g for g in optimizer.param_groups for p in g["params"]}


def _into(target, value):
    """A state value as the optimizer keeps it: into its own tensor where it has one (a DCP load already
    filled it: then nothing to do), else a private copy."""
    if not isinstance(value, torch.Tensor):
        return value
    if target is value:
        return target
    if isinstance(target, torch.Tensor) and target.shape == value.shape:
        with torch.no_grad():
            copy_into(target, value)
        return target
    return value.detach().clone()
