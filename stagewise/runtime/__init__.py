"""The runtime: run a schedule's programs for real on torch.distributed ranks.

Needs torch (``pip install stagewise[torch]``). The pieces, each one job:

- ``config``: the run's options (frozen, picklable, checked without torch);
- ``models``: the built-in GPT (a sequence of layers) and its data;
- ``stage``: cut a layer sequence into the schedule's stages and place them;
- ``comm``: point-to-point messages derived from the programs;
- ``split_backward``: the ``I`` / ``W`` halves of a backward;
- ``executor``: walk one rank's program, op by op (no per-schedule code);
- ``replicas``: tied and duplicated parameters, loss and global-norm clipping;
- ``timing``: measured timeline and the simulator's prediction from it;
- ``worker`` / ``launch``: one rank's run; local spawn or torchrun;
- ``memory``: host allocator settings for CPU ranks;
- ``reference``: the unpipelined single-process run (the oracle).
"""

from .config import RunConfig, RunError
from .launch import RankFailure, train, train_many

__all__ = ["RunConfig", "RunError", "RankFailure", "train", "train_many"]
