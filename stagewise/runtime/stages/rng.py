"""Dropout that the schedule cannot change: each layer draws from a seed of (seed, step, micro-batch, layer).

A schedule reorders forwards, and a stage holds other layers under another
split, so torch's one global generator, drawn from in program order, gives
every schedule (and every run on a stage that recomputes) other dropout masks.
Here a (stage, micro-batch) forward runs with torch's generators forked (the
state outside is left as it was) and each layer starts from its own seed
(``Stage.forward`` calls ``enter_layer``), so a mask depends on the run's seed,
the step, the micro-batch and the layer only: every family, split and number
of stages draws the masks of the unpipelined model run over the same
micro-batches (reference.py runs it so), a recomputed forward draws its F's
masks again, and a split backward draws nothing. Tensor-parallel ranks of a
stage take the same rows, hence the same seeds: they draw one mask where their
activations are replicated (Megatron's RNG tracker draws so there too). Under
data parallel, replica r's micro-batch k is micro-batch r * m + k of the step.

A layer called outside such a forward (a user's own module call) draws from
torch's generator as usual.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch


class Draw(NamedTuple):
    """What the layers of the running forward draw from."""

    seed: int
    step: int  #: steps done before this one
    mb: int  #: the micro-batch's index in the step (over every replica)
    device: torch.device


_NOW: ContextVar[Draw | None] = ContextVar("stagewise_forward_draw", default=None)


def default_seed() -> int:
    """A run's seed when none is given: torch's (``torch.manual_seed``'s, or the one torch drew), in 63 bits."""
    return torch.initial_seed() & ((1 << 63) - 1)


def layer_seed(seed: int, step: int, mb: int, layer: int) -> int:
    """The seed layer ``layer`` draws from in micro-batch ``mb`` of step ``step`` (63 bits, mixed by a hash so
    that near tuples give unrelated streams)."""
    key = f"{seed}:{step}:{mb}:{layer}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


@contextmanager
def forward(seed: int, step: int, mb: int, device: torch.device | str = "cpu"):
    """Run one forward of micro-batch ``mb`` of step ``step``: each layer entered (``enter_layer``) is seeded
    from (seed, step, mb, layer); torch's generators are as they were afterwards."""
    device = torch.device(device)
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        token = _NOW.set(Draw(seed, step, mb, device))
        try:
            yield
        finally:
            _NOW.reset(token)


def enter_layer(layer: int) -> None:
    """Seed torch's generators (CPU, and the forward's GPU) for layer ``layer``, inside ``forward`` only."""
    draw = _NOW.get()
    if draw is None:
        return
    s = layer_seed(draw.seed, draw.step, draw.mb, layer)
    torch.default_generator.manual_seed(s)
    if draw.device.type == "cuda":
        with torch.cuda.device(draw.device):
            torch.cuda.manual_seed(s)
