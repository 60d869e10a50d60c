"""A step whose loss is NaN or infinite: stop, naming where it came from, or skip its update on every rank.

``Pipeline(nonfinite=...)`` applies the policy at the end of each step. The
step's loss is all-reduced over every rank anyway, so every rank sees the same
value and takes the same branch: the normal path costs one ``math.isfinite``.
Only on a non-finite loss do the ranks gather which micro-batches produced it
(the executor keeps each F's loss), so the message names the step, the
micro-batch, its stage and the rank. ``"skip"`` (the CLI's ``--skip-nonfinite``)
drops that step's gradients on every rank, so the optimizer leaves the
weights and its state as they were.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class NonFiniteLoss(RuntimeError):
    """A step's loss is NaN or infinite under ``nonfinite="raise"`` (the default)."""


def locate_nonfinite(rank: int, mb_losses: dict) -> str:
    """`` at micro-batch 5 (stage 3, rank 1)``: where a non-finite step loss came from, gathered from every
    rank's micro-batch losses (a collective: called by every rank once the all-reduced loss is not finite)."""
    bad = [(a.stage, a.mb, float(v)) for a, v in mb_losses.items() if not torch.isfinite(v)]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (rank, bad))
    return describe(gathered)


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
