"""A config-driven run (``stagewise train``, ``plan --verify``, ``profile``, benchmarks): where its ranks come from.

``train(cfg)`` is the entry point. The unpipelined reference runs in this
process (reference.py). Under torchrun (RANK and WORLD_SIZE in the environment,
env:// rendezvous) this process is one rank. Otherwise the local launcher
(launching/launch.py) spawns p x dp ranks and watches them. Every rank runs the
same loop (worker.py): ``RunConfig`` -> ``RankTrainer`` -> ``RunResult``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import time
from datetime import timedelta
from typing import Callable, Sequence

from ... import limits
from ..launching import groups
from ..launching import launch
from ..launching.launch import RankFailure, _is_echo, describe, die_with_launcher, fail_to_launcher, is_user_error
from ..launching.launch import parent_death_signal
from ..resilience import flight
from ..resilience.preempt import Preempted
from ..config import RunConfig, RunError
from ..result import RunResult


def train(cfg: RunConfig, report: Callable | None = None) -> RunResult:
    """Run one config: unpipelined, under torchrun, or on spawned local ranks. Returns rank 0's result
    (under torchrun, this rank's: its collected copies only).

    Example::

        from stagewise.runtime import RunConfig, train
        from stagewise.runtime.run.models import GPTConfig
        res = train(RunConfig(schedule="zb-h1", ranks=2, microbatches=4, steps=3, model=GPTConfig()))
        res.losses, res.measured_bubble_fraction
    """
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
        from .reference import run_reference

        return [run_reference(cfgs[0], _job_report(report, 0))]
    if groups.is_torchrun():
        return _as_torchrun_rank(cfgs, report)
    if any(c.max_restarts for c in cfgs):
        if len(cfgs) != 1:
            raise RunError("`max_restarts` restarts one run; give it to a config run alone")
        from . import restart

        cfgs[0].check()
        return [restart.run(cfgs[0], lambda c, rep: _launch([c], rep, preflight)[0], report,
                            lambda line: sys.stderr.write(f"stagewise: {line}\n"))]
    return _launch(cfgs, report, preflight)


def _launch(cfgs: Sequence[RunConfig], report, preflight: bool) -> list[RunResult]:
    """One local launch of pipelined configs on the same ranks."""
    from .worker import preflight as check

    worlds = {check(c).ranks * (c.world // c.ranks) if preflight else c.world for c in cfgs}
    if len(worlds) != 1:
        raise RunError(f"one launch runs one number of ranks; got {sorted(worlds)}")
    world = worlds.pop()
    c = cfgs[0]
    sizes = " x ".join(f"`{d}` {n}" for d, n in (("ranks", c.ranks), ("dp", c.dp), ("fsdp", c.fsdp), ("ep", c.ep),
                                                 ("tp", c.tp)) if n > 1 or d in ("ranks", "dp"))
    limits.LOCAL_RANKS.check(world, "", detail=f"{sizes} = {world} local ranks")
    from ..launching.local import check_importable

    for c in cfgs:  # a model config from a script on stdin would kill every rank without a message
        check_importable(type(c.model), f"the model config {type(c.model).__name__}")
    grace = max((c.save_on_signal for c in cfgs if c.save_on_signal is not None), default=None)
    return launch.spawn(cfgs, world, _rank_main, timeout=max(c.timeout for c in cfgs), report=report, grace=grace,
                        preload=rank_imports(cfgs))


def rank_imports(cfgs: Sequence[RunConfig]) -> tuple[str, ...]:
    """The modules the ranks of these configs import beyond the runtime's own (a model config's
    ``rank_imports()``, such as an HF model's transformers modules): the forkserver imports them once."""
    return tuple(sorted({m for c in cfgs for m in getattr(c.model, "rank_imports", tuple)()}))


def _rank_main(rank: int, world: int, port: int, cfgs: list[RunConfig], q, timeout: float,
               box: str | None = None, lifeline=None) -> None:
    """A spawned rank: join the launcher's rendezvous, run every job, report to the launcher."""
    if lifeline is not None:
        die_with_launcher(lifeline)
    try:
        _set_threads(cfgs[0], world)
        groups.join("gloo", rank, world, port, timeout)
        path = str(flight.rank_file(box, rank)) if box else None
        results = _run_jobs(rank, world, "gloo", cfgs, lambda *a: q.put(("step", rank, *a)),  # rank 0 reports
                            flight_path=path)
        q.put(("done", rank, results))
        groups.close_groups()
    except Preempted as e:  # every rank saved after a stop notice
        q.put(("preempted", rank, e.step, e.folder))
        groups.close_groups()
    except BaseException as e:  # noqa: BLE001 - every failure goes to the launcher
        fail_to_launcher(q, rank, e)


def _run_jobs(rank: int, world: int, backend: str, cfgs, report, launched_by: str | None = None,
              flight_path: str | None = None) -> list[RunResult]:
    import torch
    import torch.distributed as dist

    from .worker import Env, run_job

    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        from ..launching.allocator import keep_freed_memory

        keep_freed_memory()
    env = Env(rank=rank, world=world, device=device, backend=backend, launched_by=launched_by,
              flight_path=flight_path)
    results = [run_job(env, c, _job_report(report, j)) for j, c in enumerate(cfgs)]
    dist.barrier()  # every rank is past its last collective before any closes its connections (close_groups)
    return results


def _as_torchrun_rank(cfgs, report) -> list[RunResult]:
    """This process is one rank of a torchrun launch (env:// rendezvous)."""
    from . import restart
    from .worker import preflight as check

    rank, world = groups.torchrun_env()
    parent_death_signal(signal.SIGKILL)  # torchrun forwards SIGTERM itself; a SIGKILLed torchrun would orphan us
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    records = None
    # torchrun's --max-restarts restarted us, or a fresh launch brought fewer ranks than an --elastic layout's
    if attempt > 0 or any(c.elastic is not None and c.world > world for c in cfgs):
        cfgs, records = zip(*(restart.torchrun_attempt(c, world, attempt) for c in cfgs))
        if rank == 0:
            print(f"stagewise: {restart.say_torchrun(records[0])}", file=sys.stderr, flush=True)
    for c in cfgs:
        check(c, world, f"WORLD_SIZE={world}")  # every rank fails alike on bad options, before any message
    backend = groups.default_backend()
    _set_threads(cfgs[0], int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    timeout = timedelta(seconds=max(c.timeout for c in cfgs))
    groups.init_torchrun(backend, timeout)
    met_at, first_steps = time.time(), {}  # the first step's end of each job, for the records' times

    def timed_report(job, k, loss, seconds):
        first_steps.setdefault(job, time.time())
        if report:
            report(job, k, loss, seconds)

    box = tempfile.mkdtemp(prefix="stagewise-flight-")
    path = flight.rank_file(box, rank)
    try:
        results = _run_jobs(rank, world, backend, cfgs, timed_report, f"WORLD_SIZE={world}", str(path))
        if records is None:
            return results
        started = restart.process_started_at()
        return [dataclasses.replace(r, restarts=(restart.timed(rec, r.checkpoint, started, met_at,
                                                               first_steps.get(j)),))
                for j, (r, rec) in enumerate(zip(results, records))]
    except Exception as e:  # one line naming this rank and its op, then its last events; torchrun stops the others
        user = is_user_error(e)
        records = {} if user else {rank: flight.read(path)}
        # a lost connection: the message it waited for names the peer that failed
        at = flight.where(records[rank], waits=_is_echo(str(e))) if records else ""
        raise RankFailure(f"rank {rank}{' ' + at if at else ''}: {describe(e)}", user=user, ranks=(rank,),
                          flight=flight.dump(records, (rank,)) if records else "") from e
    finally:
        groups.close_groups()
        shutil.rmtree(box, ignore_errors=True)


def _job_report(report, job: int):
    return None if report is None else (lambda *a: report(job, *a))


def _set_threads(cfg: RunConfig, local_ranks: int) -> None:
    import torch

    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // local_ranks))


def _with_model(cfg: RunConfig) -> RunConfig:
    if cfg.model is not None:
        return cfg
    from .models import GPTConfig

    return dataclasses.replace(cfg, model=GPTConfig())
