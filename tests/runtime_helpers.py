"""Model configs for runtime tests that must fail on purpose.

They live in a module (not a test file) so spawned ranks can unpickle them.
"""

from __future__ import annotations

import io
import os
import time
from contextlib import redirect_stdout
from dataclasses import dataclass

import torch
from torch import nn

from stagewise.runtime.run.models import GPTConfig

#: the tiny GPT every runtime test uses (8 layers: 8 stages at p=4, v=2)
TINY = GPTConfig(layers_n=6, d_model=32, heads=4, seq=16, vocab=64)


class DropToken(nn.Module):
    """Identity, except that its ``at``-th call drops the last token (a shape change between stages)."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        return x[:, :-1] if self.calls == self.at else x


class Boom(nn.Module):
    """Identity until its ``at``-th call, which raises ("raise"), kills the process ("exit") or stalls ("sleep")."""

    def __init__(self, at: int, how: str):
        super().__init__()
        self.at, self.how, self.calls = at, how, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            if self.how == "raise":
                raise RuntimeError("boom on purpose")
            if self.how == "exit":
                os._exit(3)
            time.sleep(30)
        return x


@dataclass(frozen=True, kw_only=True)
class InsertedLayer(GPTConfig):
    """The GPT with one extra layer at index ``where``: DropToken ("drop") or Boom ("raise", "exit", "sleep")."""

    extra: str = "drop"
    where: int = 1
    at: int = 3

    @property
    def num_layers(self) -> int:
        return super().num_layers + 1

    def layers(self):
        out = super().layers()
        layer = DropToken(self.at) if self.extra == "drop" else Boom(self.at, self.extra)
        return out[:self.where] + [layer] + out[self.where:]


def torch_schedule_csv(cls_name: str, ranks: int, microbatches: int, chunks: int) -> str:
    """A schedule written by torch itself (its compute-only order, one CSV row per rank)."""
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    with redirect_stdout(io.StringIO()):  # it prints its steps
        ops = get_schedule_ops(getattr(schedules, cls_name), ranks, microbatches, num_stages_per_rank=chunks)
    return "\n".join(",".join("" if a is None else str(a) for a in row) for row in ops) + "\n"


def rel_err(a, b) -> float:
    """Norm-wise relative difference of two arrays."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
