"""Spawning local ranks and watching them: the one launcher of every local run.

``spawn(jobs, world, target)`` starts ``world`` processes (forkserver, torch
preloaded), each running ``target`` (the config-driven run's ``run.train``, or
``stagewise.launch``'s user function), and watches them: when one fails, the
others are terminated at once and the error names the rank; nothing waits on a
dead peer. The ranks meet at the launcher's own rendezvous (groups.py).

The bound on a fault: a rank that raises or dies (local launch) stops every
rank within about a second (the watchdog polls every 0.1 s and gives the
others 0.5 s to report their own errors); the error names the failed rank and
the op it was at, read from its flight recorder (flight.py), and carries every
rank's last events. A rank that stalls alive is noticed by its peers after
``--timeout`` seconds (default 30), each wait for a message or collective being
bounded by it. Under torchrun the peers of a dead rank see its connection
close (or time out after ``--timeout``), and torchrun stops the node's others.

The launcher owns its ranks: they never outlive it, whatever ends it. Each
rank watches a pipe whose write end only the launcher holds (its end of file
means the launcher is gone, even by SIGKILL) and also has the kernel's
parent-death signal (Linux). The forkserver and multiprocessing's resource
tracker exit by themselves once no rank holds their pipes. SIGTERM and SIGHUP
stop every rank first, then exit with the conventional status 128 + signal
(``Stopped``); Ctrl-C (SIGINT) stops them the same way. Under torchrun,
torchrun's own handling applies (it forwards SIGTERM to its workers);
its workers also get the parent-death signal, so a SIGKILLed torchrun orphans none.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from ...errors import StagewiseError
from ..resilience import flight
from ..resilience.preempt import Preempted
from .groups import Rendezvous


class RankFailure(RuntimeError):
    """A rank failed; the message names it. ``user`` when the cause is bad input."""

    def __init__(self, message: str, user: bool = False, ranks: tuple[int, ...] = (), flight: str = ""):
        super().__init__(message)
        self.user = user
        self.ranks = ranks  #: the failed ranks
        self.flight = flight  #: the flight recorders' last events (flight.dump), to print after the message
        self.exit_codes: dict[int, int | None] = {}  #: every rank's exit status once stopped (local launch)
        self.last_event: dict[int, float] = {}  #: rank -> time.time() of its flight recorder's last event


class RankInputError(RankFailure, StagewiseError):
    """A rank's bad input (a ``StagewiseError`` raised there): the library's error type, its one-line message
    with the rank named, and still a ``RankFailure`` (``user`` is True)."""


class Stopped(SystemExit):
    """The launcher was told to stop by ``signum`` (SIGTERM, SIGHUP): its ranks are stopped; exit 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def spawn(jobs: Sequence, world: int, target: Callable, *, timeout: float, report: Callable | None = None,
          grace: float | None = None, preload: Sequence[str] = ()) -> list:
    """Start ``world`` ranks running ``target``, stream their progress, and stop them all at the first failure.

    ``target(rank, world, port, jobs, q, timeout, box, lifeline)`` is a module-level function (the rank's main:
    it joins the rendezvous on ``port``, runs ``jobs`` and reports on ``q``; ``box`` holds the flight recorders).
    Returns rank 0's results. The ranks end with this process however it ends (module docstring); SIGTERM or
    SIGHUP raises ``Stopped`` once every rank is stopped. With ``grace`` (``--save-on-signal``) the first SIGTERM
    is forwarded to the ranks instead, which save and report ``preempted``: ``Preempted`` is raised (preempt.py).
    ``preload`` names modules the ranks import, imported once by the forkserver (``_mp_context``).
    """
    ctx = _mp_context(preload)
    q = ctx.Queue()
    meeting = Rendezvous(world, timeout)  # held until the ranks are gone: no one else can take its port
    box = tempfile.mkdtemp(prefix="stagewise-flight-")  # the ranks' flight recorders, readable after a crash
    lifeline, held = ctx.Pipe(duplex=False)  # each rank gets the read end; the write end never leaves here
    procs = [ctx.Process(target=target, args=(r, world, meeting.port, list(jobs), q, timeout, box, lifeline),
                         daemon=True, name=f"stagewise-rank{r}") for r in range(world)]
    with _stop_on_signals(procs if grace is not None else None) as signals:
        try:
            for p in procs:
                p.start()
            results = _watch(procs, q, report, box)
            _reap(procs)
            return results
        except RankFailure as e:
            _stop(procs, kill=grace is not None)  # the survivors' records are final once they are gone
            e.exit_codes = {r: p.exitcode for r, p in enumerate(procs)}
            if not e.user:
                records = {r: flight.read(flight.rank_file(box, r)) for r in range(world)}
                e.flight = flight.dump(records, e.ranks)
                e.last_event = {r: es[-1].time for r, es in records.items() if es}
            if signals.noticed:  # ranks the notice's grace ended: the run was stopped, not broken
                raise Stopped(signals.noticed) from e
            raise
        finally:
            _stop(procs, kill=grace is not None)
            held.close()
            lifeline.close()
            meeting.close()
            shutil.rmtree(box, ignore_errors=True)


class _stop_on_signals:
    """Turn SIGTERM and SIGHUP into ``Stopped`` while ranks run, so the launcher stops them before it exits.

    A second signal while stopping is ignored (the stop is bounded: ``_stop`` kills after 5 s). Outside the
    main thread Python cannot set handlers; the ranks then still end with this process (their lifeline).
    Given the ``forward_to`` processes (``--save-on-signal``), the first SIGTERM is sent on to them, which save
    and report; a second one stops them at once.
    """

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))

    def __init__(self, forward_to=None):
        self.forward_to = forward_to
        self.noticed = 0  # the signal forwarded (0: none)

    def __enter__(self):
        self.old = {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._raise) for s in self.SIGNALS}
        return self

    def _raise(self, signum, frame):
        if self.forward_to is not None and signum == signal.SIGTERM and not self.noticed:
            self.noticed = signum
            for p in self.forward_to:
                if p.pid is not None and p.exitcode is None:
                    os.kill(p.pid, signum)
            return
        for s in self.SIGNALS:
            signal.signal(s, lambda *_: None)
        raise Stopped(signum)

    def __exit__(self, *exc):
        for s, handler in self.old.items():
            signal.signal(s, handler)
        return False


#: what every rank imports: torch._dynamo is what a torch.optim constructor imports first (over a second per
#: rank otherwise)
PRELOAD = ("stagewise.runtime.run.worker", "torch._dynamo")


def _mp_context(preload: Sequence[str] = ()):
    """forkserver with torch (and ``preload``: the job's own imports, such as transformers' modeling module
    of an HF model) imported once: ranks start in milliseconds instead of each importing them. A running
    forkserver that lacks some of ``preload`` is ended, and the next rank starts a new one with them all."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    want = {*PRELOAD, *preload}
    if not want <= _PRELOADED:
        _end_forkserver()  # between launches only: its ranks are gone
        _PRELOADED.update(want)  # the next one imports these and everything before (a mixed process restarts once)
    ctx.set_forkserver_preload(sorted(_PRELOADED))
    if not _FORKSERVER_ENDS:
        atexit.register(_end_forkserver)
        _FORKSERVER_ENDS.append(True)
    return ctx


_FORKSERVER_ENDS: list = []  #: the exit hook is registered (once per process)
_PRELOADED: set = set()  #: the modules the forkserver (running or next) imports


def start_early(preload: Sequence[str] = ()) -> None:
    """Start the forkserver now, so that its imports (torch, the rank's worker, ``preload``: seconds) run while
    the caller imports its own instead of after them. A no-op where ranks are spawned (no forkserver) or it is
    running with them."""
    ctx = _mp_context(preload)
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _end_forkserver() -> None:
    """At exit, end the forkserver at once: left to notice by itself, it tears torch down for seconds after
    the command has returned (a process that outlives it). It holds nothing to save: its ranks are done."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        server._stop()  # reaps it and removes its socket
    except (OSError, AttributeError):
        pass


def _watch(procs, q, report, box: str | None = None) -> list:
    """Collect results; on the first failure give the others a moment to report theirs, then fail."""
    done: dict[int, list] = {}
    errors: dict[int, tuple[str, str]] = {}
    gone: dict[int, float] = {}  # rank -> when it was first seen exited without a result
    deadline = None
    while len(done) < len(procs):
        try:
            msg = q.get(timeout=0.1)
        except queue.Empty:
            msg = None
        if msg is not None:
            kind, rank, *rest = msg
            if kind == "step" and report:
                report(*rest)
            elif kind == "done":
                done[rank] = rest[0]
            elif kind == "preempted":  # (steps done, the checkpoint's folder): every rank saved
                done[rank] = Preempted(*rest)
            elif kind == "error":
                errors[rank] = rest
        else:  # the queue is drained: a rank that has exited sent all it ever will
            now = time.monotonic()
            for r, p in enumerate(procs):
                if p.exitcode is None or r in errors or r in done:
                    continue
                if p.exitcode != 0:
                    errors[r] = ("RuntimeError", f"exited with code {p.exitcode} without a message", False)
                elif now - gone.setdefault(r, now) > 1.0:
                    errors[r] = ("RuntimeError", "exited without a result", False)
        if errors:
            deadline = deadline or time.monotonic() + 0.5
            if time.monotonic() >= deadline:
                raise _failure(errors, len(procs), box)
    if isinstance(done[0], Preempted):
        raise done[0]
    return _merge([done[r] for r in range(len(procs))])


def _failure(errors: dict[int, tuple[str, str, bool]], world: int, box: str | None = None) -> RankFailure:
    """One message naming the failing rank(s) and, from its flight recorder, the op it was at: a cause before
    its echo (a peer's lost connection), identical messages listed once; a timeout names the stalled peer."""
    by_msg: dict[str, list[int]] = {}
    for r in sorted(errors):
        by_msg.setdefault(errors[r][1], []).append(r)
    msg, ranks = min(by_msg.items(), key=lambda kv: (_is_echo(kv[0]), kv[1][0]))
    who = "every rank" if len(ranks) == world and world > 1 else "rank " + ", ".join(map(str, ranks))
    user = errors[ranks[0]][2]
    if box and not user:
        records = {r: flight.read(flight.rank_file(box, r)) for r in range(world)}
        at = flight.where(records[ranks[0]], waits=False) if len(ranks) == 1 else ""
        who += f" {at}" if at else ""
        if errors[ranks[0]][0] == "CommTimeout":
            msg += "".join(f"; rank {r} stalled {flight.where(es)}" for r, es in records.items()
                           if r not in errors and es and es[-1].kind in (flight.START, flight.GOT))
    return (RankInputError if user else RankFailure)(f"{who}: {msg}", user=user, ranks=tuple(ranks))


def _is_echo(message: str) -> bool:
    """An error that only reports another rank's failure (gloo's lost connection)."""
    return any(k in message for k in ("Connection reset by peer", "Connection closed by peer", "remote worker"))


def _merge(per_rank: list[list]) -> list:
    """Rank 0's results, with the collected parameter copies of all ranks merged (a ``RunResult`` each; a
    user's function under ``local.launch`` returns its own values, kept as they are)."""
    from ..result import RunResult, merge_copies

    out = []
    for j, res in enumerate(per_rank[0]):
        if isinstance(res, RunResult):
            res = res.with_copies(merge_copies([rr[j].grads for rr in per_rank]),
                                  merge_copies([rr[j].params for rr in per_rank]))
        out.append(res)
    return out


def _reap(procs, grace: float = 10.0) -> None:
    """Every rank reported its result: wait for them to exit. One that dies on the way out (a signal, a
    non-zero code) fails the run, as torchrun would; one still running after ``grace`` seconds is stopped."""
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    bad = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (0, None)}
    if bad:
        raise _failure({r: ("RuntimeError", f"exited with code {c}{_signal_name(c)} after reporting its result", False)
                        for r, c in bad.items()}, len(procs))


def _signal_name(code: int) -> str:
    try:
        return f" ({signal.Signals(-code).name})" if code < 0 else ""
    except ValueError:
        return ""


def _stop(procs, kill: bool = False) -> None:
    """End every rank: SIGTERM, SIGKILL after 5 s (``kill``: at once; a rank that saves on SIGTERM would
    take the signal for a notice)."""
    for p in procs:
        if p.is_alive():
            p.kill() if kill else p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def fail_to_launcher(q, rank: int, e: BaseException) -> NoReturn:
    """A spawned rank's end after a failure: tell the launcher what and where, then exit at once."""
    q.put(("error", rank, type(e).__name__, describe(e), is_user_error(e)))
    q.close()
    q.join_thread()
    os._exit(1)  # skip interpreter teardown: peers may be gone


def die_with_launcher(lifeline) -> None:
    """End this process the moment the launcher is gone: its end of ``lifeline`` (a pipe's read end) sees end of
    file when the launcher's process ends, however it ends. A thread waits on it, then SIGKILLs this process:
    nobody is left to read a result. The parent-death signal is the kernel's own guard for the parent process
    (the forkserver, or the launcher under the spawn start method)."""
    parent_death_signal(signal.SIGKILL)

    def watch():
        try:
            lifeline.recv_bytes()
        except (EOFError, OSError):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="stagewise-lifeline", daemon=True).start()


def parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent exits (prctl PR_SET_PDEATHSIG).

    False where that does not exist (not Linux). A parent that is gone already is treated as its death.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signum), 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # orphaned before the request took effect
        os.kill(os.getpid(), signum)
    return True


def is_user_error(e: BaseException) -> bool:
    """The failure is the user's input (a ``StagewiseError``: one line, exit 2), not a fault of the run."""
    return isinstance(e, StagewiseError)


def describe(e: BaseException) -> str:
    """One line for a rank's failure: a user error's own message; otherwise its type, message and where in the
    user's code it was raised (``STAGEWISE_DEBUG=1``: the whole traceback)."""
    if is_user_error(e):
        return str(e)
    if os.environ.get("STAGEWISE_DEBUG"):
        return "".join(traceback.format_exception(e))
    return f"{type(e).__name__}: {e}{origin(e)}"


def origin(e: BaseException) -> str:
    """`` (at train.py:12 in main)``: the innermost frame of the traceback outside stagewise, torch and Python's
    own library, where the user can look; '' when every frame is ours (the flight recorder names the op)."""
    skip = tuple(str(Path(m.__file__).resolve().parent) for m in _library_modules())
    where = ""
    for frame in traceback.extract_tb(e.__traceback__):
        path = str(Path(frame.filename).resolve())
        if not path.startswith(skip) and not frame.filename.startswith("<"):
            where = f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})"
    return where


def _library_modules() -> list:
    import stagewise

    mods = [stagewise, traceback]
    torch = sys.modules.get("torch")
    return mods + ([torch] if torch is not None else [])


__all__ = ["spawn", "start_early", "RankFailure", "RankInputError", "Stopped", "fail_to_launcher", "die_with_launcher", "describe"]
