"""Launching: spawn p local ranks (gloo on loopback), or run as one rank under torchrun.

``train(cfg)`` is the entry point. Under torchrun (RANK and WORLD_SIZE in the
environment, env:// rendezvous) this process is one rank. Otherwise it spawns
the ranks itself and watches them: when one fails, the others are terminated at
once and the error names the rank; nothing waits on a dead peer.

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

import dataclasses
import gc
import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from typing import Callable, NoReturn, Sequence

from ..resilience import flight
from ..run.config import MAX_LOCAL_RANKS, RunConfig, RunError
from ..run.result import RunResult

#: exceptions that are the user's input (one-line error, exit 2), by class name across processes
USER_ERRORS = ("RunError", "ScheduleError", "ScheduleArgError", "CostError", "ShapeError")


class RankFailure(RuntimeError):
    """A rank failed; the message names it. ``user`` when the cause is bad input."""

    def __init__(self, message: str, user: bool = False, ranks: tuple[int, ...] = (), flight: str = ""):
        super().__init__(message)
        self.user = user
        self.ranks = ranks  #: the failed ranks
        self.flight = flight  #: the flight recorders' last events (flight.dump), to print after the message


class Stopped(SystemExit):
    """The launcher was told to stop by ``signum`` (SIGTERM, SIGHUP): its ranks are stopped; exit 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def train(cfg: RunConfig, report: Callable | None = None) -> RunResult:
    """Run one config: unpipelined, under torchrun, or on spawned local ranks. Returns rank 0's result
    (under torchrun, this rank's: its collected copies only)."""
    return train_many([cfg], report)[0]


def train_many(cfgs: Sequence[RunConfig], report: Callable | None = None, *, preflight: bool = True
               ) -> list[RunResult]:
    """Run several configs with the same ranks in one launch (one process start for all).

    ``report(job, step, loss, seconds)`` is called after each step (from rank 0's progress).
    """
    cfgs = [_with_model(c) for c in cfgs]
    if not all(c.pipelined for c in cfgs):
        if len(cfgs) != 1:
            raise RunError("train_many runs pipelined configs only; run the reference alone")
        from ..run.reference import run_reference

        return [run_reference(cfgs[0], _job_report(report, 0))]
    if is_torchrun():
        return _as_torchrun_rank(cfgs, report)
    worlds = set()
    for c in cfgs:
        if preflight:
            from ..run.worker import preflight as check

            worlds.add(check(c).ranks * c.dp)
        else:
            worlds.add(c.ranks * c.dp)
    if len(worlds) != 1:
        raise RunError(f"one launch runs one number of ranks; got {sorted(worlds)}")
    world = worlds.pop()
    if world > MAX_LOCAL_RANKS:
        raise RunError(f"-p {cfgs[0].ranks} x --dp {cfgs[0].dp} = {world} local ranks: over the limit of "
                       f"{MAX_LOCAL_RANKS} processes on one machine (launch with torchrun across machines)")
    from .local import check_importable

    for c in cfgs:  # a model config from a script on stdin would kill every rank without a message
        check_importable(type(c.model), f"the model config {type(c.model).__name__}")
    return spawn(cfgs, world, report)


def spawn(cfgs: Sequence[RunConfig], world: int, report: Callable | None = None, target: Callable | None = None
          ) -> list:
    """Start ``world`` ranks, stream their progress, and stop them all at the first failure.

    ``target``: the rank's main (default ``_rank_main``; ``local.launch`` runs a user's function with it); it
    takes ``(rank, world, port, cfgs, q, timeout, box, lifeline)``.
    The ranks end with this process however it ends (module docstring); SIGTERM or SIGHUP raises ``Stopped``
    once every rank is stopped.
    """
    ctx = _mp_context()
    q = ctx.Queue()
    port = free_port()
    timeout = max(c.timeout for c in cfgs)
    box = tempfile.mkdtemp(prefix="stagewise-flight-")  # the ranks' flight recorders, readable after a crash
    lifeline, held = ctx.Pipe(duplex=False)  # each rank gets the read end; the write end never leaves here
    procs = [ctx.Process(target=target or _rank_main, args=(r, world, port, list(cfgs), q, timeout, box, lifeline),
                         daemon=True, name=f"stagewise-rank{r}") for r in range(world)]
    with _stop_on_signals():
        try:
            for p in procs:
                p.start()
            results = _watch(procs, q, report, box)
            _reap(procs)
            return results
        except RankFailure as e:
            _stop(procs)  # the survivors' records are final once they are gone
            if not e.user:
                e.flight = flight.dump({r: flight.read(flight.rank_file(box, r)) for r in range(world)}, e.ranks)
            raise
        finally:
            _stop(procs)
            held.close()
            lifeline.close()
            shutil.rmtree(box, ignore_errors=True)


class _stop_on_signals:
    """Turn SIGTERM and SIGHUP into ``Stopped`` while ranks run, so the launcher stops them before it exits.

    A second signal while stopping is ignored (the stop is bounded: ``_stop`` kills after 5 s). Outside the
    main thread Python cannot set handlers; the ranks then still end with this process (their lifeline).
    """

    SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))

    def __enter__(self):
        self.old = {}
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._raise) for s in self.SIGNALS}
        return self

    def _raise(self, signum, frame):
        for s in self.SIGNALS:
            signal.signal(s, lambda *_: None)
        raise Stopped(signum)

    def __exit__(self, *exc):
        for s, handler in self.old.items():
            signal.signal(s, handler)
        return False


def _mp_context():
    """forkserver with torch preloaded: ranks start in milliseconds instead of each importing torch."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # torch._dynamo is what a torch.optim constructor imports first (over a second per rank otherwise)
    ctx.set_forkserver_preload(["stagewise.runtime.run.worker", "torch._dynamo"])
    return ctx


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
            elif kind == "error":
                errors[rank] = rest
        else:  # the queue is drained: a rank that has exited sent all it ever will
            now = time.monotonic()
            for r, p in enumerate(procs):
                if p.exitcode is None or r in errors or r in done:
                    continue
                if p.exitcode != 0:
                    errors[r] = ("RuntimeError", f"exited with code {p.exitcode} without a message")
                elif now - gone.setdefault(r, now) > 1.0:
                    errors[r] = ("RuntimeError", "exited without a result")
        if errors:
            deadline = deadline or time.monotonic() + 0.5
            if time.monotonic() >= deadline:
                raise _failure(errors, len(procs), box)
    return _merge([done[r] for r in range(len(procs))])


def _failure(errors: dict[int, tuple[str, str]], world: int, box: str | None = None) -> RankFailure:
    """One message naming the failing rank(s) and, from its flight recorder, the op it was at: a cause before
    its echo (a peer's lost connection), identical messages listed once; a timeout names the stalled peer."""
    by_msg: dict[str, list[int]] = {}
    for r in sorted(errors):
        by_msg.setdefault(errors[r][1], []).append(r)
    msg, ranks = min(by_msg.items(), key=lambda kv: (_is_echo(kv[0]), kv[1][0]))
    who = "every rank" if len(ranks) == world and world > 1 else "rank " + ", ".join(map(str, ranks))
    user = errors[ranks[0]][0] in USER_ERRORS
    if box and not user:
        records = {r: flight.read(flight.rank_file(box, r)) for r in range(world)}
        at = flight.where(records[ranks[0]], waits=False) if len(ranks) == 1 else ""
        who += f" {at}" if at else ""
        if errors[ranks[0]][0] == "CommTimeout":
            msg += "".join(f"; rank {r} stalled {flight.where(es)}" for r, es in records.items()
                           if r not in errors and es and es[-1].kind in (flight.START, flight.GOT))
    return RankFailure(f"{who}: {msg}", user=user, ranks=tuple(ranks))


def _is_echo(message: str) -> bool:
    """An error that only reports another rank's failure (gloo's lost connection)."""
    return any(k in message for k in ("Connection reset by peer", "Connection closed by peer", "remote worker"))


def _merge(per_rank: list[list]) -> list:
    """Rank 0's results, with the collected parameter copies of all ranks merged (a ``RunResult`` each; a
    user's function under ``local.launch`` returns its own values, kept as they are)."""
    from ..run.result import RunResult, merge_copies

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
        raise _failure({r: ("RuntimeError", f"exited with code {c}{_signal_name(c)} after reporting its result")
                        for r, c in bad.items()}, len(procs))


def _signal_name(code: int) -> str:
    try:
        return f" ({signal.Signals(-code).name})" if code < 0 else ""
    except ValueError:
        return ""


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def _rank_main(rank: int, world: int, port: int, cfgs: list[RunConfig], q, timeout: float,
               box: str | None = None, lifeline=None) -> None:
    """A spawned rank: gloo on loopback, run every job, report to the launcher (flight recorder in ``box``)."""
    if lifeline is not None:
        die_with_launcher(lifeline)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        _set_threads(cfgs[0], world)
        _init_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        path = str(flight.rank_file(box, rank)) if box else None
        results = _run_jobs(rank, world, "gloo", cfgs, lambda *a: q.put(("step", rank, *a)),  # rank 0 reports
                            flight_path=path)
        q.put(("done", rank, results))
        _close_groups()
    except BaseException as e:  # noqa: BLE001 - every failure goes to the launcher
        fail_to_launcher(q, rank, e)


def fail_to_launcher(q, rank: int, e: BaseException) -> NoReturn:
    """A spawned rank's end after a failure: tell the launcher what and where, then exit at once."""
    q.put(("error", rank, type(e).__name__, _describe(e)))
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


def _run_jobs(rank: int, world: int, backend: str, cfgs, report, launched_by: str | None = None,
              flight_path: str | None = None) -> list[RunResult]:
    import torch

    from ..run.worker import Env, run_job

    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        from .memory import keep_freed_memory

        keep_freed_memory()
    env = Env(rank=rank, world=world, device=device, backend=backend, launched_by=launched_by,
              flight_path=flight_path)
    results = [run_job(env, c, _job_report(report, j)) for j, c in enumerate(cfgs)]
    # every rank is past its last collective before any closes its connections (_close_groups)
    import torch.distributed as dist

    dist.barrier()
    return results


def _as_torchrun_rank(cfgs, report) -> list[RunResult]:
    """This process is one rank of a torchrun launch (env:// rendezvous)."""
    import torch

    from ..run.worker import preflight as check

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    parent_death_signal(signal.SIGKILL)  # torchrun forwards SIGTERM itself; a SIGKILLed torchrun would orphan us
    for c in cfgs:
        check(c, world, f"WORLD_SIZE={world}")  # every rank fails alike on bad options, before any message
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"
    _set_threads(cfgs[0], int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    _init_group(backend, init_method="env://", timeout=timedelta(seconds=max(c.timeout for c in cfgs)))
    box = tempfile.mkdtemp(prefix="stagewise-flight-")
    path = flight.rank_file(box, rank)
    try:
        return _run_jobs(rank, world, backend, cfgs, report, f"WORLD_SIZE={world}", str(path))
    except Exception as e:  # one line naming this rank and its op, then its last events; torchrun stops the others
        user = type(e).__name__ in USER_ERRORS
        records = {} if user else {rank: flight.read(path)}
        # a lost connection: the message it waited for names the peer that failed
        at = flight.where(records[rank], waits=_is_echo(str(e))) if records else ""
        raise RankFailure(f"rank {rank}{' ' + at if at else ''}: {_describe(e)}", user=user, ranks=(rank,),
                          flight=flight.dump(records, (rank,)) if records else "") from e
    finally:
        _close_groups()
        shutil.rmtree(box, ignore_errors=True)


def _init_group(backend: str, **kwargs) -> None:
    """``init_process_group``, after the import that would otherwise keep its default group alive for good.

    torch.distributed.nn.functional binds ``group.WORLD`` as default arguments when it is imported, and
    torch._dynamo imports it (the first torch.optim constructor imports torch._dynamo). Imported after
    ``init_process_group``, it holds the default group past ``destroy_process_group`` (see ``_close_groups``);
    imported before, those defaults are None. (The local launcher's forkserver preloads it anyway.)
    """
    import torch._dynamo  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group(backend, **kwargs)


def _close_groups() -> None:
    """Destroy every process group and free it now, while the interpreter is fully alive.

    A gloo group's worker thread drops each finished Work a moment after its waiter has returned; when the
    Work holds a tensor whose Python object is gone (gather_object's buffers, or the earlier work a barrier
    keeps a reference to), freeing it takes the GIL. If the interpreter is finalizing by then, that thread
    exits inside a destructor: "terminate called without an active exception", SIGABRT, after a run that
    printed its result. Freeing a group joins its threads (the GIL released) first, so none is left at exit.
    ``destroy_process_group`` frees only the groups nothing else holds: the trainer's reference cycles hold
    its sub-groups (replicas.py, dp.py) until the next collection, hence ``gc.collect()``.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _job_report(report, job: int):
    return None if report is None else (lambda *a: report(job, *a))


def _set_threads(cfg: RunConfig, local_ranks: int) -> None:
    import torch

    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // local_ranks))


def _describe(e: BaseException) -> str:
    if type(e).__name__ in USER_ERRORS:
        return str(e)
    if os.environ.get("STAGEWISE_DEBUG"):
        return "".join(traceback.format_exception(e))
    return f"{type(e).__name__}: {e}"


def _with_model(cfg: RunConfig) -> RunConfig:
    if cfg.model is not None:
        return cfg
    from ..run.models import GPTConfig

    return dataclasses.replace(cfg, model=GPTConfig())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


__all__ = ["train", "train_many", "spawn", "RankFailure", "Stopped", "is_torchrun"]
