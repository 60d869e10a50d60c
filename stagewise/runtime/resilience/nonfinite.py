"""A step whose loss is NaN or infinite: stop, naming where it came from, or skip its update on every rank.

The step's loss is all-reduced over every rank before the optimizer runs, so
every rank sees the same value and takes the same branch: the normal path
costs one ``math.isfinite``. Only on a non-finite loss do the ranks gather
which micro-batches produced it (the executor keeps each F's loss), so the
message names the step, the micro-batch, its stage and the rank. With
``--skip-nonfinite`` every rank drops that step's gradients and leaves its
weights and optimizer state as they were.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class NonFiniteLoss(RuntimeError):
    """A step's loss is NaN or infinite and --skip-nonfinite was not given."""


class Guard:
    """Checks each step's loss. Mutable: the steps it skipped."""

    def __init__(self, rank: int, world: int, skip: bool):
        self.rank, self.world, self.skip = rank, world, skip
        self.skipped: list[dict] = []

    def check(self, k: int, loss: float, mb_losses: dict) -> bool:
        """True to apply step ``k``'s update; raises ``NonFiniteLoss`` or records a skip otherwise."""
        if math.isfinite(loss):
            return True
        bad = [(a.stage, a.mb, float(v)) for a, v in mb_losses.items() if not torch.isfinite(v)]
        gathered = [None] * self.world
        dist.all_gather_object(gathered, (self.rank, bad))
        where = describe(gathered)
        if not self.skip:
            raise NonFiniteLoss(f"step {k + 1}: the loss is {loss}{where}; stopped (--skip-nonfinite skips such a "
                                "step's update and goes on)")
        self.skipped.append({"step": k + 1, "loss": loss, "where": where.removeprefix(" at ")})
        return False


def describe(gathered: list) -> str:
    """`` at micro-batch 5 (stage 3, rank 1)`` from each rank's (rank, [(stage, mb, value)]); '' if none."""
    parts = []
    for rank, bad in gathered:
        by_stage: dict[int, list[int]] = {}
        for stage, mb, _ in bad:
            by_stage.setdefault(stage, []).append(mb)
        for stage, mbs in sorted(by_stage.items()):
            word = "micro-batch" if len(mbs) == 1 else "micro-batches"
            parts.append(f"{word} {', '.join(map(str, sorted(mbs)))} (stage {stage}, rank {rank})")
    return " at " + "; ".join(parts) if parts else ""
