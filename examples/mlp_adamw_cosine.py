"""An MLP with layers of different widths, pipelined over 2 ranks, in a plain loop with AdamW and a cosine LR.

    torchrun --nproc-per-node 2 examples/mlp_adamw_cosine.py
    python examples/mlp_adamw_cosine.py          # the same, on 2 ranks spawned here

The loop is the user's: stagewise only runs each rank's part of the step.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import stagewise

WIDTHS = [16, 64, 128, 32, 48, 4]  # every layer a different width


def layers() -> list[nn.Module]:
    torch.manual_seed(0)
    out: list[nn.Module] = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        out += [nn.Linear(a, b), nn.GELU()]
    return out[:-1]  # no activation after the last Linear


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression task: learn sin of the first four inputs."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, WIDTHS[0], generator=g)
    return x, torch.sin(x[:, :4])


def main(steps: int = 60) -> tuple[float, float]:
    pipe = stagewise.Pipeline("1f1b", layers(), F.mse_loss, microbatches=4)
    opt = torch.optim.AdamW(pipe.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    for step in range(steps):
        res = pipe.step(*data(step))  # the step's loss, on every rank
        pipe.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(res.loss)
    if dist.get_rank() == 0:
        print(f"mlp: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {steps} steps (1f1b, 2 ranks, AdamW + cosine)")
    return losses[0], losses[-1]


if __name__ == "__main__":
    stagewise.launch(main, 2)
