"""A model built by a layer factory: each rank calls it only for the layers of its own stages.

    torchrun --nproc-per-node 2 examples/factory_per_rank.py
    python examples/factory_per_rank.py

Like DeepSpeed's LayerSpec: no rank ever allocates another rank's parameters,
so a model larger than one host can be pipelined. The factory below says which
layers it was asked for, and each rank counts the parameter bytes it holds.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import stagewise

LAYERS, D = 8, 64


def build(i: int) -> nn.Module:
    """Layer i: an input projection, residual MLP blocks, an output projection."""
    built.append(i)
    torch.manual_seed(i)  # each layer's weights depend on i only, whichever rank builds it
    if i == 0:
        return nn.Linear(16, D)
    if i == LAYERS - 1:
        return nn.Linear(D, 1)
    return nn.Sequential(nn.LayerNorm(D), nn.Linear(D, D), nn.GELU())


built: list[int] = []


def main(steps: int = 20) -> dict:
    model = stagewise.Layers(count=LAYERS, build=build, names=tuple(f"layer{i}" for i in range(LAYERS)))
    pipe = stagewise.Pipeline("interleaved-1f1b", model, F.mse_loss, microbatches=4, chunks=2)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 16, generator=g)
    y = x.sum(1, keepdim=True).tanh()
    losses = []
    for _ in range(steps):
        losses.append(pipe.step(x, y).loss)
        opt.step()
        opt.zero_grad()
    held = sum(p.numel() * p.element_size() for p in pipe.parameters())
    rank = dist.get_rank()
    print(f"rank {rank}: built layers {sorted(built)}, holds {held} parameter bytes")
    if rank == 0:
        print(f"factory: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {steps} steps (interleaved-1f1b, v=2)")
    return {"built": sorted(built), "bytes": held, "first": losses[0], "last": losses[-1]}


if __name__ == "__main__":
    stagewise.launch(main, 2)
