"""A stop notice (SIGTERM: a spot instance's notice, a scheduler's eviction) saves the run before it ends.

With ``--save-on-signal GRACE`` every rank installs a ``StopNotice``: the first SIGTERM only sets a flag, so the
step in flight runs to its end on every rank (a step is never cut halfway: its messages and collectives
would be left in flight). After each step the ranks agree (one all-reduce of the flag: the notice may reach
one rank, or reach them at different moments), and if any rank has it every rank writes a checkpoint of the
step just finished and leaves with ``Preempted`` (exit 143, 128 + SIGTERM). A watchdog ends the rank with
143 when GRACE seconds have passed since the notice, whatever it is doing: a save cut short has no
manifest, so no resume ever takes it. A second SIGTERM ends the rank at once.

The local launcher forwards its own SIGTERM to its ranks (launch.py); torchrun forwards it itself. torch is
imported only by ``agreed``: the launcher, which raises ``Preempted`` for the whole run, needs none.

Your own loop gets the same: ``stagewise.StopNotice`` is this watch, and ``stagewise.Preempted`` the exit::

    with stagewise.StopNotice(grace=60) as notice:
        for step in range(start, steps):
            pipe.step(x, y); opt.step(); opt.zero_grad()
            stop = notice.agreed()                     # a collective: has any rank had SIGTERM?
            if stop or (step + 1) % 100 == 0:
                save(step + 1)
            if stop:
                raise stagewise.Preempted(step + 1, folder)   # exit 143
"""

from __future__ import annotations

import os
import signal
import threading
import time

#: the exit status of a preempted run: 128 + SIGTERM, as a process killed by it
EXIT_CODE = 128 + signal.SIGTERM


class Preempted(SystemExit):
    """Every rank saved after a stop notice; ``step``: the steps done (the checkpoint's), ``folder``: where.
    Raised uncaught, the process exits 143 without a traceback (a ``SystemExit``)."""

    def __init__(self, step: int, folder: str | None = None):
        super().__init__(EXIT_CODE)
        self.step, self.folder = step, folder


class StopNotice:
    """One rank's watch for SIGTERM (``stagewise.StopNotice``; ``train --save-on-signal``'s). Mutable: when the
    notice came (None: not yet).

    ``grace``: seconds from the notice to the end of this rank (exit 143), whatever it is doing: the bound on
    the step in flight and the save. ``device``: where the flag is all-reduced (default: the current GPU under
    NCCL, else the CPU). A context manager: leaving restores the SIGTERM handler it replaced. Installed only
    in a process's main thread (Python sets handlers there only); elsewhere it never fires.
    """

    def __init__(self, grace: float = 30.0, device=None):
        from ..config import check_positive_number

        check_positive_number("`grace`", grace)
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

        if self.device is None:
            self.device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else \
                torch.device("cpu")
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

    def __enter__(self) -> "StopNotice":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
