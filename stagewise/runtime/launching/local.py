"""``launch(fn, ranks)``: run a user's function on every rank, spawned locally or as one rank under torchrun.

Locally, ranks are processes on this machine (gloo on loopback) started and
watched by the launcher (launch.py): when one fails, the others stop at once
and the error names the rank. Under torchrun this process is already one rank
and ``fn`` simply runs. Spawned ranks import ``fn`` by its module and name, so
it must be a module-level function of a file (a script run as
``python script.py`` with its work under ``if __name__ == "__main__":``).
"""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ... import limits
from ..config import RunError, check_timeout


@dataclass(frozen=True, kw_only=True)
class Job:
    """What every spawned rank runs (pickled to it)."""

    fn: Callable
    args: tuple
    kwargs: dict
    threads: int | None
    timeout: float  #: seconds a rank waits for a peer (the launcher reads it)


def launch(fn: Callable[..., Any], ranks: int, *args, timeout: float = 30.0, threads: int | None = None,
           **kwargs) -> Any:
    """Run ``fn(*args, **kwargs)`` on ``ranks`` ranks; returns rank 0's return value.

    ``timeout``: seconds a rank waits for a peer; ``threads``: torch threads per rank (default cores / ranks).
    A rank's bad input (a ``StagewiseError`` there) is raised here as ``RankInputError``, a ``StagewiseError``
    with its message and the rank named; any other failure of a rank is a ``RankFailure`` naming it.

    Example::

        def main():
            pipe = stagewise.Pipeline("1f1b", layers, loss_fn, microbatches=4)
            ...
        if __name__ == "__main__":
            stagewise.launch(main, ranks=2)
    """
    from . import launch as launcher
    from .groups import is_torchrun

    if is_torchrun():
        return fn(*args, **kwargs)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise RunError(f"`ranks` must be a whole number >= 1; got {ranks!r}")
    limits.LOCAL_RANKS.check(ranks, "`ranks`")
    check_timeout(timeout)
    check_importable(fn, "the function")
    job = [Job(fn=fn, args=args, kwargs=kwargs, threads=threads, timeout=timeout)]
    try:
        results = launcher.spawn(job, ranks, _rank_main, timeout=timeout)
    except launcher.RankInputError as e:  # a rank's bad input reads as in one process: no launcher frames
        raise e.with_traceback(None) from None
    # rank 0's return value of the caller's own ``fn``, pickled by a process this call started and handed over
    # its in-memory queue (which pickles every message anyway): never bytes read from a file, and of whatever
    # type ``fn`` returns, so no list of admitted types applies
    return pickle.loads(results[0]["value"])


def check_importable(fn: Callable, what: str) -> None:
    """A spawned rank finds ``fn`` (a function or class) by module and name: say what to change when it cannot."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(fn, "__module__", None) == "__main__" and not (path and os.path.isfile(path)):
        raise RunError(f"stagewise: {what} is defined in a script read from stdin (or python -c), which spawned "
                       "ranks cannot import; save the script to a file and run `python script.py`, or run it under "
                       "torchrun (torchrun --nproc-per-node N script.py)")
    try:
        pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise RunError(f"stagewise.launch: {getattr(fn, '__qualname__', fn)!r} cannot be sent to spawned ranks "
                       f"({e}); pass a function defined at the top level of a module or script") from None


def _rank_main(rank: int, world: int, port: int, job: list, q, timeout: float, box: str | None = None,
               lifeline=None) -> None:
    """A spawned rank: gloo on loopback, torchrun's environment variables, then the user's function."""
    from . import groups
    from .launch import die_with_launcher, fail_to_launcher

    if lifeline is not None:
        die_with_launcher(lifeline)
    fn, threads = job[0].fn, job[0].threads
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
        groups.join("gloo", rank, world, port, timeout)
        value = fn(*job[0].args, **job[0].kwargs)
        dist.barrier()  # every rank is past its last collective before any closes its connections
        # bytes, by value: a tensor put on the queue as is would be shared memory this process takes along
        q.put(("done", rank, [{"value": pickle.dumps(value) if rank == 0 else None}]))
        groups.close_groups()
    except BaseException as e:  # noqa: BLE001 - every failure goes to the launcher
        fail_to_launcher(q, rank, e)
