"""A stop notice (SIGTERM: a spot instance's notice, a scheduler's eviction) saves the run before it ends.

With ``--save-on-signal GRACE`` every rank installs a ``Notice``: the first SIGTERM only sets a flag, so the
step in flight runs to its end on every rank (a step is never cut halfway: its messages and collectives
would be left in flight). After each step the ranks agree (one all-reduce of the flag: the notice may reach
one rank, or reach them at different moments), and if any rank has it every rank writes a checkpoint of the
step just finished and leaves with ``Preempted`` (exit 143, 128 + SIGTERM). A watchdog ends the rank with
143 when GRACE seconds have passed since the notice, whatever it is doing: a save cut short has no
manifest, so no resume ever takes it. A second SIGTERM ends the rank at once.

The local launcher forwards its own SIGTERM to its ranks (launch.py); torchrun forwards it itself. torch is
imported only by ``agreed``: the launcher, which raises ``Preempted`` for the whole run, needs none.
"""

from __future__ import annotations

import os
import signal
import threading
import time

#: the exit status of a preempted run: 128 + SIGTERM, as a process killed by it
EXIT_CODE = 128 + signal.SIGTERM


class Preempted(SystemExit):
    """Every rank saved after a stop notice; ``step``: the steps done (the checkpoint's), ``folder``: where."""

    def __init__(self, step: int, folder: str | None):
        super().__init__(EXIT_CODE)
        self.step, self.folder = step, folder


class Notice:
    """One rank's watch for SIGTERM. Mutable: when the notice came (None: not yet).

    Installed only in a process's main thread (Python sets handlers there only); elsewhere it never fires.
    """

    def __init__(self, grace: float, device):
        self.grace, self.device = grace, device
        self.at: float | None = None
        self.signals = 0  # received here (a notice another rank had, learnt by agreeing, is not one)
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signals += 1
        if self.signals > 1:  # the second notice: stop now
            os._exit(EXIT_CODE)
        self._start()

    def _start(self) -> None:
        if self.at is not None:
            return
        self.at = time.monotonic()
        timer = threading.Timer(self.grace, os._exit, (EXIT_CODE,))  # the grace is a bound, not a hope
        timer.daemon = True
        timer.start()

    def agreed(self) -> bool:
        """Has any rank had the notice? (A collective: every rank calls it after each step.)"""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([0 if self.at is None else 1], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():  # a rank that did not get it starts its clock now
            self._start()
        return bool(flag.item())

    def close(self) -> None:
        """Restore the handler this one replaced (a finished run leaves SIGTERM as it found it)."""
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
            self.old = None
