"""The runtime: run a schedule's programs for real on torch.distributed ranks, driven by the user's loop.

Needs torch (``pip install stagewise[torch]``). Its spine is ``pipeline.Pipeline``, one rank's part of a
model stepped by the user's loop; everything else is a client of it or one of its parts, a folder per job:
``stages`` (how a model becomes this rank's stages), ``execution`` (the schedule lowered for one rank and
walked op by op), ``messages`` (every cross-rank message), ``parallel`` (mesh, dp, FSDP, tp, ep, ties),
``resilience`` (flight recorder, non-finite losses, checkpoints, injected faults), ``launching`` (local ranks
and process groups), ``run`` (the driver: config-driven runs,
``RunConfig`` -> ``RunResult``, the CLI's path). At its floor, imported by every folder: ``config``
(``RunError``, ``RunConfig``, the checks; no torch), ``arguments``, ``resolve`` (the one schedule resolution),
``result`` (``RunResult``) and ``dtensor``. This package exports the run API: ``train``,
``RunConfig``, ``RunResult`` (docs/api.md).

May import: the core, `stagewise.schedules` (the schedule a run resolves), `torch`.
"""

from .config import RunConfig, RunError
from .launching.launch import RankFailure, RankInputError
from .run.train import train, train_many
from .result import Memory, RunResult

__all__ = ["RunConfig", "RunError", "RankFailure", "RankInputError", "RunResult", "Memory", "train", "train_many"]
