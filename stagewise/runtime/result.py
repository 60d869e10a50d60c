"""What a run returns: one typed value, and its JSON (the one place ``train --json`` keys are written).

No torch here: results travel between processes (pickled) and the CLI reads
them without the runtime.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..parallelism import Parallelism

#: logical parameter name -> one numpy array per copy (every holder on every rank), as ``collect`` asks
Copies = dict[str, list]


@dataclass(frozen=True, kw_only=True)
class Memory:
    """Memory of a pipelined run, per rank: activations measured against the simulator's prediction (when
    counted), and the model state (parameters, gradients, optimizer) counted against the parallelism's share."""

    stage_activation_bytes: Any = None  #: per stage, the bytes each action kind adds (activation_memory.merge_added)
    peak_activation_bytes: tuple[float, ...] | None = None  #: measured peak per rank (every rank of the grid)
    predicted_peak_activation_bytes: tuple[float, ...] | None = None  #: the simulator's, per rank of one replica
    peak_memory_allocated_bytes: tuple[int, ...] | None = None  #: torch.cuda.max_memory_allocated per rank (GPU)
    #: per rank, bytes held of {"parameters", "gradients", "optimizer"} after the first step (parallel/state_memory.py)
    state_bytes: tuple[dict, ...] | None = None
    #: per rank, the same as the parallelism says: each parameter over the ranks sharing it (the planner's rule)
    predicted_state_bytes: tuple[dict, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """One run's result (rank 0's, with every rank's collected copies merged by the launcher).

    >>> r = RunResult(schedule="1f1b", ranks=2, microbatches=4, losses=(4.2, 4.1), step_time_s=(0.02, 0.01))
    >>> r.to_json()["losses"]
    [4.2, 4.1]
    """

    schedule: str  #: the schedule's name ("none": the unpipelined reference)
    ranks: int  #: p, ranks of one pipeline replica
    microbatches: int  #: m
    slices: int = 1  #: sequence slices per micro-batch (the schedule ran m x slices units)
    losses: tuple[float, ...]  #: per step, the mean loss over the step's batch
    first_step: int = 0  #: steps done before ``losses[0]`` (a resumed run's, a torchrun-restarted attempt's)
    step_time_s: tuple[float, ...]  #: per step, seconds (program, collectives, optimizer)
    timelines: tuple = ()  #: per step, the measured Timeline (rank 0 only)
    measured_bubble_fraction: float | None = None  #: over the steps after the first (rank 0)
    predicted_bubble_fraction: float | None = None  #: the simulator's, fed the measured mean cost per action kind
    parallelism: Parallelism | None = None  #: the layout run (None: the unpipelined reference)
    recompute: tuple[int, ...] | None = None  #: stages that recompute their forward
    memory: Memory | None = None  #: rank 0 of a run that counted activations (not --no-memory)
    checkpoint: dict | None = None  #: what --save / --resume did (checkpoint.Checkpoints.info)
    skipped_steps: tuple[dict, ...] | None = None  #: steps whose update --skip-nonfinite skipped
    layers_built: tuple[tuple[int, ...], ...] | None = None  #: per rank, the model layers it built (its own only)
    read_bytes: tuple[int, ...] | None = None  #: per rank, bytes of weights read from a model folder (HF)
    #: a --max-restarts run's transitions, one per restart: the step, what was lost, the old and new layout and
    #: the time from the death to the first step after it (restart.py)
    restarts: tuple[dict, ...] | None = None
    grads: Copies | None = None  #: collect="grads": after step 1
    tokens: tuple[int, ...] | None = None  #: per step, the batch's real tokens (targets not -100; float: rows)
    token_places: tuple[int, ...] | None = None  #: per step, its token places (real tokens plus padding)
    params: Copies | None = None  #: collect="params": at the end

    @property
    def dp(self) -> int | None:
        """Pipeline replicas (None: the unpipelined reference)."""
        return None if self.parallelism is None else self.parallelism.dp

    fsdp = property(lambda self: 1 if self.parallelism is None else self.parallelism.fsdp, doc="FSDP degree")
    tp = property(lambda self: 1 if self.parallelism is None else self.parallelism.tp, doc="tensor parallel degree")
    zero = property(lambda self: 0 if self.parallelism is None else self.parallelism.zero, doc="1: ZeRO-1")
    ep = property(lambda self: 1 if self.parallelism is None else self.parallelism.ep, doc="expert parallel degree")

    @property
    def steps(self) -> list[int]:
        """The step number (from 1) of each of ``losses``."""
        return list(range(self.first_step + 1, self.first_step + len(self.losses) + 1))

    @property
    def padding_fraction(self) -> float | None:
        """Padding over all token places of the run's steps (None: not counted)."""
        if not self.token_places or not sum(self.token_places):
            return None
        return 1.0 - sum(self.tokens) / sum(self.token_places)

    @property
    def tokens_per_s(self) -> float | None:
        """Real tokens per second of step time, over the steps after the first (it warms up) when there are."""
        if not self.tokens or len(self.tokens) != len(self.step_time_s):
            return None
        k = 1 if len(self.tokens) > 1 else 0
        seconds = sum(self.step_time_s[k:])
        return sum(self.tokens[k:]) / seconds if seconds > 0 else None

    @property
    def last_timeline(self):
        """The last step's measured timeline, or None (not rank 0, or no step)."""
        return self.timelines[-1] if self.timelines else None

    def to_json(self) -> dict:
        """The ``train --json`` object: the keys tests and users read, sections only when the run has them."""
        out = {"schedule": self.schedule, "ranks": self.ranks, "microbatches": self.microbatches,
               **({"slices": self.slices} if self.slices > 1 else {}),
               "losses": list(self.losses), "step_time_s": list(self.step_time_s),
               "measured_bubble_fraction": self.measured_bubble_fraction,
               "predicted_bubble_fraction": self.predicted_bubble_fraction}
        if self.tokens and len(self.tokens) == len(self.losses):  # real tokens, padding, rate (docs/packing.md)
            out.update(tokens=sum(self.tokens), padding_fraction=self.padding_fraction,
                       tokens_per_s=self.tokens_per_s)
        if self.first_step:  # a resumed run, a torchrun-restarted attempt: its losses' step numbers
            out["steps"] = self.steps
        if self.dp is not None:
            out.update(dp=self.dp, fsdp=self.fsdp, tp=self.tp, zero=self.zero, recompute=list(self.recompute or ()))
            out["parallelism"] = self.parallelism.to_dict()  # the layout run, as the planner's JSON writes it
        if self.ep > 1:
            out["ep"] = self.ep
        if self.memory is not None:
            m = self.memory
            if m.peak_activation_bytes is not None:
                out.update(peak_activation_bytes=list(m.peak_activation_bytes),
                           predicted_peak_activation_bytes=list(m.predicted_peak_activation_bytes),
                           peak_memory_allocated_bytes=(None if m.peak_memory_allocated_bytes is None
                                                        else list(m.peak_memory_allocated_bytes)))
            if m.state_bytes is not None:
                out.update(state_bytes=list(m.state_bytes), predicted_state_bytes=list(m.predicted_state_bytes))
        if self.checkpoint is not None:
            out["checkpoint"] = self.checkpoint
        if self.skipped_steps is not None:
            out["skipped_steps"] = list(self.skipped_steps)
        if self.layers_built is not None:
            out["layers_built_per_rank"] = [list(b) for b in self.layers_built]
        if self.read_bytes is not None:
            out["read_bytes_per_rank"] = list(self.read_bytes)
        if self.restarts is not None:
            out["restarts"] = list(self.restarts)
        return out

    def with_copies(self, grads: Copies | None, params: Copies | None) -> "RunResult":
        """This result with the collected copies replaced (the launcher merges every rank's)."""
        return dataclasses.replace(self, grads=grads, params=params)


def merge_copies(per_rank: list[Copies | None]) -> Copies | None:
    """Every rank's copies of each parameter, in rank order; None when no rank collected."""
    if all(c is None for c in per_rank):
        return None
    merged: Copies = {}
    for copies in per_rank:
        for name, arrays in (copies or {}).items():
            merged.setdefault(name, []).extend(arrays)
    return merged
