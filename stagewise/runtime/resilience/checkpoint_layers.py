"""The layer-keyed checkpoints of an earlier stagewise (``stagewise-checkpoint/2``): read, never written.

Such a step folder holds one ``layer-NNNNN.pt`` per model layer: that layer's logical parameters (``3.fc.weight``;
a tied one with its first use) and their optimizer state. Resuming one loads every local copy of each
parameter from its layer's file, each sharded parameter taking its own shard of the whole tensor, and hands
the optimizer its state the same way, so such a checkpoint resumes under any layout too, FSDP and tensor
parallel included. New saves are DCP checkpoints (checkpoint.py).
"""

from __future__ import annotations

import io

import torch

from . import checkpoint_files as files
from .checkpoint_files import layer_file
from ..config import RunError


def home_layer(logical: str) -> int:
    """The layer whose file held a logical parameter: its first use (``stage.logical_names``: "3.fc.weight")."""
    return int(logical.split(".", 1)[0])


def restore(folder, manifest: dict, pipe, optimizer) -> None:
    """Load a layer-keyed checkpoint into ``pipe``'s parameters (every copy) and ``optimizer``."""
    from ..stages.names import copy_into

    payloads: dict[int, dict] = {}
    optim = {}
    for name, holders in pipe.stage_map.params.items():
        copies = pipe.names.local(holders)
        if not copies:
            continue
        layer = home_layer(name)
        if layer not in payloads:
            payloads[layer] = _payload(folder, layer, files.read_verified(folder, layer_file(layer), manifest))
        if name not in payloads[layer]["params"]:
            held = ", ".join(sorted(payloads[layer]["params"])[:2]) or "nothing"
            raise RunError(f"`resume` {folder}: {layer_file(layer)} does not hold {name} (it holds {held}): "
                           "the layer files were swapped or edited; resume from another checkpoint")
        value = payloads[layer]["params"][name]
        if tuple(value.shape) != tuple(copies[0].shape) or value.dtype != copies[0].dtype:
            raise RunError(f"`resume` {folder}: parameter {name} is {_shown(value)} there and {_shown(copies[0])} "
                           "in this model")
        with torch.no_grad():
            for p in copies:
                copy_into(p, value)
        original = pipe.original_name(name)
        for k, v in (payloads[layer]["optim"].get(name) or {}).items():
            optim[f"state.{original}.{k}"] = v
    pipe.names.load_optimizer_state_dict(optimizer, optim, hyperparameters=False)


def _shown(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} of shape {tuple(t.shape)}"


def _payload(folder, layer: int, data: bytes) -> dict:
    """A layer file's contents: {"params": {name: tensor}, "optim": {name: state}}, or ``RunError`` naming the
    file (its bytes match the manifest but are not one of our layer files)."""
    name = layer_file(layer)
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is not ours
        raise RunError(f"`resume` {folder}: {name} is not a layer file of a checkpoint ({type(e).__name__}); "
                       "resume from another checkpoint") from None
    why = _shape_problem(payload)
    if why:
        raise RunError(f"`resume` {folder}: {name} is not a layer file of a checkpoint ({why}); resume from another "
                       "checkpoint")
    return payload


def _shape_problem(payload) -> str:
    """What keeps ``payload`` from being a layer file's ``{"params": {name: tensor}, "optim": {name: {key:
    tensor}}}`` ('' when nothing does)."""
    if not (isinstance(payload, dict) and isinstance(payload.get("params"), dict)
            and isinstance(payload.get("optim"), dict)):
        return "no params and optim state"
    for key, value in payload["params"].items():
        if not (isinstance(key, str) and isinstance(value, torch.Tensor)):
            return f"its parameter {str(key)[:80]!r} is not a tensor"
    for key, state in payload["optim"].items():
        if not (isinstance(key, str) and isinstance(state, dict) and all(
                isinstance(k, str) and (isinstance(v, torch.Tensor) or type(v) in (int, float))
                for k, v in state.items())):
            return f"its optimizer state of {str(key)[:80]!r} is not a dict of tensors"
    return ""
