"""DTensors without importing them: ``is_dtensor`` and ``local`` (a DTensor's shard, or the tensor itself).

At the runtime's floor because the stages, the executor's memory accounting, the parallelisms and the
built-in model all ask it, and tensor parallel (``parallel.tp``), which makes DTensors, sits above them.
"""

from __future__ import annotations

import sys

import torch


def is_dtensor(t) -> bool:
    """``t`` is a DTensor (without importing DTensor, which takes a second, when no DTensor can exist)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view of its storage), or the tensor itself."""
    return t.to_local() if is_dtensor(t) else t
