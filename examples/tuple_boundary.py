"""A model whose stages pass a tuple: hidden states and an integer padding mask; the length changes every step.

    torchrun --nproc-per-node 2 examples/tuple_boundary.py
    python examples/tuple_boundary.py

The mask is an int64 tensor: it crosses each boundary with the hidden states and
carries no gradient. Each step has its own sequence length (as batches of
variable-length text do); only the micro-batches of one step must agree.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import stagewise

VOCAB, D, PAD = 32, 24, 0


class Embed(nn.Module):
    """token ids -> (hidden states, mask: 1 for a real token, 0 for padding)."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)

    def forward(self, ids):
        return self.tok(ids), (ids != PAD).long()


class MaskedMix(nn.Module):
    """Each position adds the mean of the real tokens before it (padding is left out by the mask)."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(D, D)
        self.ff = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))

    def forward(self, state):
        h, mask = state
        m = mask.unsqueeze(-1).to(h.dtype)
        prefix = (h * m).cumsum(1) / m.cumsum(1).clamp_min(1)
        h = h + self.mix(prefix)
        return h + self.ff(h), mask


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(D, VOCAB)

    def forward(self, state):
        h, _ = state
        return self.out(h)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def data(step: int):
    """A batch of 8 sequences of length 6..12 (a new length each step); the target is the next token."""
    g = torch.Generator().manual_seed(step)
    length = 6 + step % 7
    start = torch.randint(1, VOCAB, (8, 1), generator=g)
    ids = (start + torch.arange(length + 1)) % (VOCAB - 1) + 1  # a counting sequence: learnable
    cut = torch.randint(length // 2, length + 1, (8,), generator=g)  # real tokens per row; the rest is padding
    ids[torch.arange(length + 1) >= cut.unsqueeze(1)] = PAD
    x, y = ids[:, :-1].clone(), ids[:, 1:].clone()
    y[(x == PAD) | (y == PAD)] = -100
    return x, y


def main(steps: int = 40) -> tuple[float, float]:
    torch.manual_seed(0)
    layers = [Embed(), MaskedMix(), MaskedMix(), MaskedMix(), Head()]
    pipe = stagewise.Pipeline("zb-v", layers, loss_fn, microbatches=4)  # 4 stages: a V over 2 ranks
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
    losses = [None] * steps
    for step in range(steps):
        losses[step] = pipe.step(*data(step)).loss
        opt.step()
        opt.zero_grad()
    if dist.get_rank() == 0:
        print(f"tuple boundary: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {steps} steps (zb-v, lengths 6..12)")
    return losses[0], losses[-1]


if __name__ == "__main__":
    stagewise.launch(main, 2)
