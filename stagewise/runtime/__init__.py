"""The runtime: run a schedule's programs for real on torch.distributed ranks.

Needs torch (``pip install stagewise[torch]``). The pieces, each one job:

- ``config``: the run's options (frozen, picklable, checked without torch);
- ``models``: the built-in GPT (a sequence of layers) and its data;
- ``stage``: cut a layer sequence into the schedule's stages and place them;
- ``comm``: point-to-point messages derived from the programs;
- ``split_backward``: the ``I`` / ``W`` halves of a backward;
- ``executor``: walk one rank's program, op by op (no per-schedule code);
- ``dp``: data x pipeline parallel (p x dp ranks, per-stage gradient all_reduce);
- ``recompute``: F keeps only the stage input, the backward replays the forward;
- ``activation_memory``: the bytes held for in-flight micro-batches, and the
  simulator's prediction of their peak per rank;
- ``replicas``: tied and duplicated parameters, loss and global-norm clipping;
- ``timing``: measured timeline and the simulator's prediction from it;
- ``pipeline``: the per-rank API a user's loop drives (``stagewise.Pipeline``);
  ``layers`` (the model as layers built per rank), ``names`` (original names,
  ties, state_dicts), ``pytree`` (what crosses a boundary), ``local``
  (``stagewise.launch``: a user's function on local ranks);
- ``worker`` / ``launch``: the CLI's run of a config (a client of ``pipeline``); local spawn (ranks that die with
  the launcher) or torchrun;
- ``memory``: host allocator settings for CPU ranks;
- ``result``: what a run returns (``RunResult``, typed; its JSON);
- ``reference``: the unpipelined single-process run (the oracle);
- ``resilience``: what keeps a long run safe, attached to each rank's trainer:
  ``flight`` (each rank's last events, readable after a crash), ``nonfinite``
  (a NaN/inf loss stops or skips the step), ``checkpoint`` / ``checkpoint_files`` /
  ``checkpoint_manifest`` (layer-keyed, atomic saves and resumes; the manifest's schema and
  the run it names), ``faults`` (failures on purpose, for tests).
"""

from .run.config import RunConfig, RunError
from .launching.launch import RankFailure
from .run.train import train, train_many
from .run.result import Memory, RunResult

__all__ = ["RunConfig", "RunError", "RankFailure", "RunResult", "Memory", "train", "train_many"]
