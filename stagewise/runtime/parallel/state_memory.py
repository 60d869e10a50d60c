"""What each rank holds of the model's state, counted, next to what the parallelism says it should hold.

Per rank: parameter, gradient and optimizer-state bytes (the local shards of sharded ones; optimizer scalars
such as Adam's step count aside). The prediction is the planner's rule applied to this rank's parameters:
each parameter's bytes over the ranks it is split across (``fsdp``, ``tp`` where the plan splits it: its
DTensor's Shard placements), its gradient the same, and Adam's two moments twice that, over ``dp`` more under
ZeRO-1. Measured and predicted differ only by FSDP's uneven shards (a dimension the ranks do not divide) and
ZeRO-1's partition, which gives whole parameters to ranks.
"""

from __future__ import annotations

import math

import torch

from ..dtensor import is_dtensor, local

#: optimizers whose state the prediction knows: two moments the size of each parameter
ADAM = ("adam", "adamw")


def held_bytes(params: list[torch.Tensor], optimizer) -> dict[str, int]:
    """{"parameters", "gradients", "optimizer"}: bytes of what this rank holds (local shards)."""
    state = getattr(optimizer, "optim", optimizer).state  # ZeroRedundancyOptimizer: its partition's
    return {"parameters": sum(_bytes(p) for p in params),
            "gradients": sum(_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(_bytes(v) for st in state.values() for v in st.values()
                             if isinstance(v, torch.Tensor) and v.dim() > 0)}


def predicted_bytes(params: list[torch.Tensor], optimizer_name: str, zero_over: int = 1) -> dict[str, float | None]:
    """The same, as the parallelism says: each parameter's whole bytes over the ranks it is sharded across;
    the optimizer's only for Adam (None otherwise), over ``zero_over`` replicas under ZeRO-1."""
    share = sum(_whole(p) / _split(p) for p in params)
    adam = optimizer_name.lower() in ADAM
    return {"parameters": share, "gradients": share, "optimizer": 2 * share / zero_over if adam else None}


def _bytes(t: torch.Tensor) -> int:
    t = local(t)
    return t.numel() * t.element_size()


def _whole(p: torch.Tensor) -> int:
    return math.prod(p.shape) * p.element_size()  # a DTensor's shape is the whole tensor's


def _split(p: torch.Tensor) -> int:
    """How many ranks share ``p``'s values out: the sizes of the mesh dimensions it is sharded along."""
    if not is_dtensor(p):
        return 1
    return math.prod(n for n, pl in zip(p.device_mesh.shape, p.placements) if not pl.is_replicate())
