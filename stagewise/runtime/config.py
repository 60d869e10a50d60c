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

    schedule: Any = "1f1b"  #: family name or a Schedule value; None runs the unpipelined reference
    csv: str | None = None  #: read the schedule from torch's compute-only CSV instead
    ranks: int = 4  #: p, the ranks launched
    microbatches: int = 8  #: m
    chunks: int | None = None  #: v (family default when None)
    dp: int = 1  #: pipeline replicas (data parallel); p x dp ranks in all
    measure_memory: bool = True  #: count activation bytes per rank (costs ~1-15% of a small model's step)
    recompute: bool | tuple[int, ...] = False  #: recompute the forward in the backward: all stages, or these
    steps: int = 1  #: optimizer steps
    batch: int = 8  #: sequences per step (split into m micro-batches)
    model: Any = None  #: a model config (models.GPTConfig or one with the same methods)
    split: tuple[int, ...] | None = None  #: layers per stage of one model copy; None = even
    lr: float = 1e-3
    optimizer: str = "adamw"  #: any torch.optim class name, case-insensitive
    clip: float | None = None  #: clip the global gradient norm to this value
    timeout: float = 30.0  #: seconds any rank waits for a message or a collective: the bound on a stalled peer
    threads: int | None = None  #: torch threads per rank; default: cores / ranks
    collect: tuple[str, ...] = field(default=())  #: extra results: "grads" (after step 1), "params" (at the end)
    save: str | None = None  #: checkpoint folder: a step-NNNNNNNN folder every save_every steps and at the end
    save_every: int | None = None  #: steps between checkpoints (None: at the end only)
    resume: str | None = None  #: continue from this checkpoint (a --save folder: its newest complete one)
    skip_nonfinite: bool = False  #: a nan/inf loss skips that step's update on every rank instead of stopping
    fault: str | None = None  #: tests only: a rank fails on purpose, e.g. "exit:rank=1:action=1F3" (faults.py)

    @property
    def pipelined(self) -> bool:
        """Runs on ranks (p x dp > 1), not as the in-process reference."""
        return (self.schedule is not None or self.csv is not None) and self.ranks * self.dp > 1

    def check(self) -> None:
        """Checks that need neither torch nor the schedule; raise ``RunError``."""
        for name, value, low in (("--steps", self.steps, 1), ("--batch", self.batch, 1),
                                 ("-p", self.ranks, 1), ("-m", self.microbatches, 1)):
            if value < low:
                raise RunError(f"{name} must be >= {low}; got {value}")
        if self.pipelined and self.batch % self.microbatches:
            raise RunError(f"--batch {self.batch} does not split into -m {self.microbatches} equal micro-batches; "
                           f"use a --batch that is a multiple of {self.microbatches}")
        self._check_scale()
        self._check_resilience()
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

    def _check_scale(self) -> None:
        """--dp and --recompute (runtime at scale)."""
        if self.dp < 1:
            raise RunError(f"--dp must be >= 1; got {self.dp}")
        if not self.pipelined and (self.dp > 1 or self.recompute):
            what = f"--dp {self.dp}" if self.dp > 1 else "--recompute"
            raise RunError(f"{what} needs a --schedule run on ranks (-p or --dp >= 2); the unpipelined reference "
                           "runs in one process")
        share = self.microbatches * self.dp
        if self.dp > 1 and self.batch % share:
            raise RunError(f"--batch {self.batch} does not split into --dp {self.dp} replicas of -m "
                           f"{self.microbatches} equal micro-batches; use a --batch that is a multiple of {share}")

    def _check_resilience(self) -> None:
        """--save, --save-every, --resume and the test fault (checkpoint_files.py, faults.py)."""
        if self.save_every is not None and self.save_every < 1:
            raise RunError(f"--save-every must be >= 1; got {self.save_every}")
        if not self.pipelined and (self.save or self.resume):
            what = "--save" if self.save else "--resume"
            raise RunError(f"{what} needs a pipeline (a --schedule and -p >= 2); the unpipelined reference keeps "
                           "no checkpoints")
        if self.fault:
            from .faults import parse_fault

            parse_fault(self.fault)
