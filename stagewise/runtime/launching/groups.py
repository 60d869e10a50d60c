"""The process group's life: made once per process, closed while the interpreter is alive.

Every way a rank starts (the local launcher's spawned ranks, ``stagewise.launch``, a ``Pipeline`` built
under torchrun without a group, a torchrun rank of ``stagewise train``) goes through ``init_group`` and
ends with ``close_groups``; nothing else calls ``init_process_group``.

Locally the launcher owns the rendezvous: ``Rendezvous`` binds a TCPStore to port 0 in the launching
process and keeps it open until every rank is done, so no other process can take the port between
choosing it and the ranks connecting (a closed probe socket's port could be taken in that gap).

Starting is not stepping. Before the ranks meet, each imports torch and builds (or reads) its own layers:
about a second on an idle machine, tens of seconds at a load of 10 on 2 cores, and one rank may be that
much later than the others. A step's ``timeout`` (30 s by default: how long a rank waits for a peer's
message) is the wrong bound for that, so the rendezvous and the pipeline's first exchange (``meet``) wait up
to ``startup_s()`` (300 s, ``STAGEWISE_STARTUP_S``), torchtitan's split of an init and a train timeout; then
the group's collectives wait ``timeout`` again (``settle``). A rank that does not come in time is named:
"rank 5 did not reach the rendezvous ... within 300 s".
"""

from __future__ import annotations

import gc
import os
from datetime import timedelta

HOST = "127.0.0.1"  #: local ranks meet on loopback only
STARTUP_S = 300.0  #: how long ranks may take to meet (start, build their layers): a loaded machine is slow
STARTUP_ENV = "STAGEWISE_STARTUP_S"
_state = {"step_timeout": None, "meetings": 0}  #: the timeout ``settle`` restores; pipelines met so far


def torchrun_attempt_store(timeout: timedelta):
    """Under torchrun's restarts (``--max-restarts``): a client of torchrun's agent store whose keys are this
    attempt's own (``stagewise/attempt-N``), else None (``env://`` then). The agent's store outlives a failed
    attempt, and ``env://`` reuses its keys as they are: a restarted rank can read a dead peer's address and
    find it refused (gloo's "connectFullMesh failed ... Connection refused", two restarts in three here)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
                          False, timeout=timeout)
    return dist.PrefixStore(f"stagewise/attempt-{attempt}", store)


def init_torchrun(backend: str, timeout: timedelta) -> tuple[int, int]:
    """Make this torchrun rank's group (``stagewise train`` under torchrun, a ``Pipeline`` built there without
    one): on the agent's store under this attempt's prefix (``torchrun_attempt_store``), else ``env://``.
    (RANK, WORLD_SIZE)."""
    rank, world = torchrun_env()  # RANK and WORLD_SIZE make sense, or no rendezvous waits for them
    store = torchrun_attempt_store(timedelta(seconds=startup_s(timeout.total_seconds())))
    init_group(backend, timeout=timeout, **({"store": store, "rank": rank, "world_size": world} if store
                                            else {"init_method": "env://"}))
    return rank, world


def startup_s(timeout_s: float = 0.0) -> float:
    """Seconds the ranks may take to meet: ``STAGEWISE_STARTUP_S`` (default 300), at least ``timeout_s``."""
    from ..config import RunError

    raw = os.environ.get(STARTUP_ENV, "")
    try:
        value = float(raw) if raw.strip() else STARTUP_S
    except ValueError:
        value = -1.0
    if not 0 < value < 1e7:
        raise RunError(f"{STARTUP_ENV}={raw!r}: expected seconds, a number > 0")
    return max(value, timeout_s)


def is_torchrun() -> bool:
    """This process is one rank of a torchrun launch (its environment names the rank and the world)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_env() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) of this torchrun rank, read once here: whole numbers, 0 <= RANK < WORLD_SIZE (else
    ``RunError`` naming the variable, before any rendezvous could wait for ranks that never come)."""
    from ..config import RunError

    values = {}
    for name in ("RANK", "WORLD_SIZE"):
        raw = os.environ.get(name, "")
        try:
            values[name] = int(raw)
        except ValueError:
            raise RunError(f"{name}={raw!r}: expected a whole number (torchrun sets it)") from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    if world < 1:
        raise RunError(f"WORLD_SIZE={world}: expected the number of ranks, >= 1")
    if not 0 <= rank < world:
        raise RunError(f"RANK={rank} with WORLD_SIZE={world}: a rank is 0 .. WORLD_SIZE - 1")
    return rank, world


def default_backend() -> str:
    """NCCL where this process sees a GPU, else gloo."""
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "gloo"


class Rendezvous:
    """The launcher's TCPStore on a port of its own (bound to port 0, held until ``close``).

    Mutable: owns the store. ``port`` is what ranks connect to (``join``).
    """

    def __init__(self, world: int, timeout_s: float):
        import torch.distributed as dist

        self.store = dist.TCPStore(HOST, 0, world, True, timeout=timedelta(seconds=timeout_s),
                                   wait_for_workers=False)
        self.port = self.store.port

    def close(self) -> None:
        self.store = None


def join(backend: str, rank: int, world: int, port: int, timeout_s: float) -> None:
    """A spawned rank joins the launcher's rendezvous on ``port`` (``Rendezvous``) and makes the group."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    store = dist.TCPStore(HOST, port, world, False, timeout=timedelta(seconds=startup_s(timeout_s)))
    init_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def init_group(backend: str, *, timeout: timedelta = timedelta(seconds=30), **kwargs) -> None:
    """``init_process_group`` with the startup allowance (``startup_s``) as its timeout until ``settle`` sets
    ``timeout``; a rank that never reaches the rendezvous is named (``RunError``).

    Imported first: torch.distributed.nn.functional binds ``group.WORLD`` as default arguments when it is
    imported, and torch._dynamo imports it (the first torch.optim constructor imports torch._dynamo).
    Imported after ``init_process_group``, it holds the default group past ``destroy_process_group`` (see
    ``close_groups``); imported before, those defaults are None. (The local forkserver preloads it anyway.)
    """
    import torch._dynamo  # noqa: F401
    import torch.distributed as dist

    startup = startup_s(timeout.total_seconds())
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=startup), **kwargs)
    except (dist.DistStoreError, dist.DistNetworkError) as e:
        raise _late("the rendezvous", startup, e, kwargs) from None
    _state["step_timeout"] = timeout


def _late(what: str, startup: float, error: BaseException, kwargs: dict) -> Exception:
    """``RunError``: the ranks did not all reach ``what`` in time, naming the missing one(s) when known."""
    import re

    from ..config import RunError

    rank = kwargs.get("rank", os.environ.get("RANK", "?"))
    missing = re.findall(r"/(\d+)(?:,|\s|$)", str(error).split("keys:", 1)[1]) if "keys:" in str(error) else []
    who = (f"rank {', '.join(missing)} did not" if missing else "not every rank did")
    where = os.environ.get("MASTER_ADDR", HOST) + ":" + os.environ.get("MASTER_PORT", "?")
    return RunError(f"rank {rank}: {who} reach {what} at {where} within {startup:g} s (ranks still starting on a "
                    f"loaded machine, or stopped before it; {STARTUP_ENV}=S waits longer)")


def meet(what: str) -> None:
    """Every rank has reached ``what`` (a pipeline's first exchange): each marks its arrival in the default
    group's store and waits for the others up to ``startup_s()``, so a late rank is named rather than timing
    out a collective; then the group's timeout becomes the step's (``settle``). Every rank calls it alike."""
    import torch.distributed as dist

    from ..config import RunError

    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    _state["meetings"] += 1
    keys = [f"stagewise/meet/{_state['meetings']}/{r}" for r in range(world)]
    store.set(keys[rank], b"1")
    startup = startup_s((_state["step_timeout"] or timedelta()).total_seconds())
    try:
        store.wait(keys, timedelta(seconds=startup))
    except (dist.DistStoreError, RuntimeError):
        missing = [str(r) for r, k in enumerate(keys) if not store.check([k])]
        raise RunError(f"rank {rank}: rank {', '.join(missing) or '?'} did not reach {what} within {startup:g} s "
                       f"(still starting or building its layers on a loaded machine, or stopped; {STARTUP_ENV}=S "
                       "waits longer)") from None
    settle()


def settle() -> None:
    """The ranks have met: the default group's collectives wait the step's timeout from now on (a no-op for a
    group this module did not make)."""
    import torch.distributed as dist

    timeout, _state["step_timeout"] = _state["step_timeout"], None
    if timeout is not None and dist.is_initialized():
        dist.distributed_c10d._set_pg_timeout(timeout)


def close_groups() -> None:
    """Destroy every process group and free it now, while the interpreter is fully alive.

    A gloo group's worker thread drops each finished Work a moment after its waiter has returned; when the
    Work holds a tensor whose Python object is gone (gather_object's buffers, or the earlier work a barrier
    keeps a reference to), freeing it takes the GIL. If the interpreter is finalizing by then, that thread
    exits inside a destructor: "terminate called without an active exception", SIGABRT, after a run that
    printed its result. Freeing a group joins its threads (the GIL released) first, so none is left at exit.
    ``destroy_process_group`` frees only the groups nothing else holds: reference cycles may hold sub-groups
    (the parallel groups of a Pipeline) until the next collection, hence ``gc.collect()``.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
