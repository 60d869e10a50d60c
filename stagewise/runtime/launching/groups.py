"""The process group's life: made once per process, closed while the interpreter is alive.

Every way a rank starts (the local launcher's spawned ranks, ``stagewise.launch``, a ``Pipeline`` built
under torchrun without a group, a torchrun rank of ``stagewise train``) goes through ``init_group`` and
ends with ``close_groups``; nothing else calls ``init_process_group``.

Locally the launcher owns the rendezvous: ``Rendezvous`` binds a TCPStore to port 0 in the launching
process and keeps it open until every rank is done, so no other process can take the port between
choosing it and the ranks connecting (a closed probe socket's port could be taken in that gap).
"""

from __future__ import annotations

import gc
import os
from datetime import timedelta

HOST = "127.0.0.1"  #: local ranks meet on loopback only


def is_torchrun() -> bool:
    """This process is one rank of a torchrun launch (its environment names the rank and the world)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


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
    store = dist.TCPStore(HOST, port, world, False, timeout=timedelta(seconds=timeout_s))
    init_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))


def init_group(backend: str, **kwargs) -> None:
    """``init_process_group``, after the import that would otherwise keep its default group alive for good.

    torch.distributed.nn.functional binds ``group.WORLD`` as default arguments when it is imported, and
    torch._dynamo imports it (the first torch.optim constructor imports torch._dynamo). Imported after
    ``init_process_group``, it holds the default group past ``destroy_process_group`` (see ``close_groups``);
    imported before, those defaults are None. (The local launcher's forkserver preloads it anyway.)
    """
    import torch._dynamo  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group(backend, **kwargs)


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
