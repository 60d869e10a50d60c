"""A user's model and loop for the Pipeline API tests, next to the plain torch loop they must equal.

In a module (not a test file) so spawned ranks can import the functions they run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import stagewise

VOCAB, STEPS, LR = 16, 3, 1e-2
WIDTHS = (8, 12, 20, 6, 16, 10, 8)  # varied widths between the embedding and the tied head


class Head(nn.Module):
    """The output layer; its weight is the embedding's (a tied parameter)."""

    def __init__(self, weight: nn.Parameter):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return F.linear(x, self.weight)


def layers() -> list[nn.Module]:
    """Embedding, six Linear+Tanh layers of varied widths, the tied head: 8 layers."""
    torch.manual_seed(0)
    emb = nn.Embedding(VOCAB, WIDTHS[0])
    mid = [nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in zip(WIDTHS, WIDTHS[1:])]
    return [emb, *mid, Head(emb.weight)]


def loss_fn(out, y):
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


def batch(k: int, rows: int = 8, seq: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + k)
    x = torch.randint(0, VOCAB, (rows, seq), generator=g)
    return x, torch.randint(0, VOCAB, (rows, seq), generator=g)


def reference(accumulate: int = 1, clip: float | None = None) -> tuple[list[float], dict]:
    """The plain torch loop: losses of each step and the final state_dict."""
    model = nn.Sequential(*layers())
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for k in range(STEPS):
        for a in range(accumulate):
            x, y = batch(k * accumulate + a)
            loss = loss_fn(model(x), y)
            loss.backward()
            losses.append(loss.item())
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def train_cases(cases, accumulate: int = 1, clip: float | None = None, dp: int = 1) -> dict:
    """Rank function: for each (family, m, v) the user's loop through stagewise.Pipeline; rank 0 returns
    {case: (losses, full state_dict)}."""
    out = {}
    for name, m, v in cases:
        pipe = stagewise.Pipeline(name, layers(), loss_fn, microbatches=m, chunks=v, dp=dp)
        opt = torch.optim.AdamW(pipe.parameters(), lr=LR)
        losses = []
        for k in range(STEPS):
            for a in range(accumulate):
                losses.append(pipe.step(*batch(k * accumulate + a)).loss)
            if clip is not None:
                pipe.clip_grad_norm_(clip)
            opt.step()
            opt.zero_grad()
        out[(name, m, v)] = (losses, pipe.full_state_dict())
    return out
