"""How the mixtures of experts store their experts: one tensor per expert in the files, stacked in the module.

transformers 5 holds a sparse MoE block's experts as two stacked tensors, ``mlp.experts.gate_up_proj``
(experts x 2 inner x hidden: each expert's gate and up projections, concatenated) and
``mlp.experts.down_proj`` (experts x hidden x inner), and converts published checkpoints on load (its
``conversion_mapping``): those store each expert's ``gate_proj``, ``up_proj`` and ``down_proj`` (Mixtral's
``w1``, ``w3``, ``w2``, under ``block_sparse_moe`` instead of ``mlp``). ``sources`` names what a folder holds
for a module tensor (itself, or its per-expert pieces with their shapes) and ``assemble`` builds the module
tensor from the pieces, so a rank reads only its own layers' tensors either way. A folder stagewise writes
holds the stacked tensors, which transformers loads as they are. No torch at import.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

#: model_type -> the per-expert projections' names: (gate, up, down), and the MoE block's stored module name
LEGACY = {
    "mixtral": (("w1", "w3", "w2"), "block_sparse_moe"),
    "qwen2_moe": (("gate_proj", "up_proj", "down_proj"), "mlp"),
    "qwen3_moe": (("gate_proj", "up_proj", "down_proj"), "mlp"),
    "deepseek_v3": (("gate_proj", "up_proj", "down_proj"), "mlp"),
}
FUSED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


class Piece(NamedTuple):
    """One stored tensor a module tensor is built from."""

    name: str  #: the HF name in the folder
    shape: tuple[int, ...]


def sources(model_type: str, name: str, shape: tuple[int, ...], stored: set[str] | Mapping) -> list[Piece]:
    """What the folder holds for module tensor ``name`` of ``shape``: itself when stored so, else its per-expert
    pieces (or the router's old name); the module name itself when neither is there (the caller says missing)."""
    if name in stored or model_type not in LEGACY:
        return [Piece(name, shape)]
    (gate, up, down), block = LEGACY[model_type]
    prefix, fused = _split(name)
    if fused is None:
        renamed = _block(name, block)
        return [Piece(renamed, shape)] if renamed in stored else [Piece(name, shape)]
    base = f"{prefix}{block}.experts."
    experts = shape[0]
    if fused == FUSED[0]:
        inner = shape[1] // 2
        return [Piece(f"{base}{e}.{p}.weight", (inner, shape[2])) for p in (gate, up) for e in range(experts)]
    return [Piece(f"{base}{e}.{down}.weight", tuple(shape[1:])) for e in range(experts)]


def assemble(pieces: list, name: str):
    """The module tensor from its pieces' tensors (in ``sources``' order)."""
    import torch

    if len(pieces) == 1:
        return pieces[0]
    if name.endswith(FUSED[0]):
        half = len(pieces) // 2
        return torch.stack([torch.cat([g, u]) for g, u in zip(pieces[:half], pieces[half:])])
    return torch.stack(pieces)


def _split(name: str) -> tuple[str, str | None]:
    """(the layer prefix ending in '.', the fused tensor's suffix) or (name, None)."""
    for suffix in FUSED:
        if name.endswith("." + suffix):
            return name[:-len(suffix)], suffix
    return name, None


def _block(name: str, block: str) -> str:
    """``name`` with its ``.mlp.`` written as the stored block name (Mixtral's ``block_sparse_moe``)."""
    return name.replace(".mlp.", f".{block}.", 1) if block != "mlp" else name
