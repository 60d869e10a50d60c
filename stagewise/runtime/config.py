"""What one training run is: a frozen, picklable config (it travels to every rank).

No torch here, so options are checked before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class RunError(ValueError):
    """Bad input to a run (the message names the option, the value and the rule)."""


#: the ``collect`` items a run can return besides losses and timings (tests use them)
COLLECT = ("grads", "params")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run: schedule, model, data and optimizer settings."""

    schedule: str | None = "1f1b"  #: family name; None runs the unpipelined reference
    csv: str | None = None  #: read the schedule from torch's compute-only CSV instead
    ranks: int = 4  #: p, the ranks launched
    microbatches: int = 8  #: m
    chunks: int | None = None  #: v (family default when None)
    steps: int = 1  #: optimizer steps
    batch: int = 8  #: sequences per step (split into m micro-batches)
    model: Any = None  #: a model config (models.GPTConfig or one with the same methods)
    split: tuple[int, ...] | None = None  #: layers per stage of one model copy; None = even
    lr: float = 1e-3
    optimizer: str = "adamw"  #: any torch.optim class name, case-insensitive
    clip: float | None = None  #: clip the global gradient norm to this value
    timeout: float = 120.0  #: seconds any rank waits for a message or a collective
    threads: int | None = None  #: torch threads per rank; default: cores / ranks
    collect: tuple[str, ...] = field(default=())  #: extra results: "grads" (after step 1), "params" (at the end)

    @property
    def pipelined(self) -> bool:
        return (self.schedule is not None or self.csv is not None) and self.ranks > 1

    def check(self) -> None:
        """Checks that need neither torch nor the schedule; raise ``RunError``."""
        for name, value, low in (("--steps", self.steps, 1), ("--batch", self.batch, 1),
                                 ("-p", self.ranks, 1), ("-m", self.microbatches, 1)):
            if value < low:
                raise RunError(f"{name} must be >= {low}; got {value}")
        if self.pipelined and self.batch % self.microbatches:
            raise RunError(f"--batch {self.batch} does not split into -m {self.microbatches} equal micro-batches; "
                           f"use a --batch that is a multiple of {self.microbatches}")
        if self.lr <= 0:
            raise RunError(f"--lr must be > 0; got {self.lr}")
        if self.clip is not None and not self.clip > 0:
            raise RunError(f"--clip must be > 0; got {self.clip}")
        if self.timeout <= 0:
            raise RunError(f"--timeout must be > 0 seconds; got {self.timeout}")
        bad = [c for c in self.collect if c not in COLLECT]
        if bad:
            raise RunError(f"collect {bad[0]!r} is not one of {', '.join(COLLECT)}")
        if self.model is not None and hasattr(self.model, "check"):
            self.model.check()
