"""Activation recomputation: a stage's F keeps only its input, its backward redoes the forward first.

F runs under ``torch.no_grad`` (autograd saves nothing) and keeps the detached
input and the RNG state the forward started from. The backward (B, or I for a
split backward) restores that state, runs the forward again with autograd on,
and differentiates the result, so dropout draws the same masks. W reads only
what I kept (split_backward.py): the forward is never recomputed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

from ..config import RunError


class Recompute:
    """The stages of one rank that recompute. Immutable after construction."""

    def __init__(self, stages: frozenset[int], device: torch.device):
        self.stages, self.device = stages, device

    def __contains__(self, stage: int) -> bool:
        return stage in self.stages

    def rng_state(self) -> tuple:
        """The RNG state a forward starts from (CPU, and the device's on CUDA)."""
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    @contextmanager
    def replaying(self, state: tuple):
        """Run the block from RNG state ``state``; the RNG outside is left as it was."""
        cpu, cuda = state
        with torch.random.fork_rng(devices=[self.device] if cuda is not None else []):
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state(cuda, self.device)
            yield


def check_recompute(option, name: str = "recompute") -> None:
    """``recompute`` (or ``offload``): True, False, or stage numbers (a list of ints); a string is not a list."""
    if isinstance(option, bool):
        return
    ok = not isinstance(option, (str, bytes)) and hasattr(option, "__iter__")
    if ok:
        option = list(option)
        ok = all(isinstance(s, int) and not isinstance(s, bool) for s in option)
    if not ok:
        raise RunError(f"`{name}` must be True, False or a list of stage numbers such as [0, 2]; got {option!r}")


def recompute_stages(option: bool | Sequence[int], stages: int, name: str = "recompute") -> frozenset[int]:
    """The schedule stages that recompute (or offload, ``name``): all (``True``), none (``False``) or the listed
    ones."""
    if option is True:
        return frozenset(range(stages))
    if option is False:
        return frozenset()
    bad = [s for s in option if not 0 <= s < stages]
    if bad:
        raise RunError(f"`{name}` {','.join(map(str, option))}: stage {bad[0]} is not a stage of the "
                       f"schedule (it has stages 0..{stages - 1})")
    return frozenset(option)
