"""Offload: a (stage, mb)'s saved activations on host memory between the program's OFFLOAD and RELOAD.

The forward of a (stage, mb) that the program offloads runs under saved-tensor hooks that record the storage of
every tensor autograd saves for its backward (``torch.autograd.graph.saved_tensors_hooks``; the stage's
parameters and buffers, and views of them, pass through untouched). OFFLOAD copies each recorded storage to the
host and resizes the device storage to nothing, so its device bytes are freed whoever holds a view of it
(autograd's saved tensors, a split backward's recorded holder outputs); RELOAD resizes it back and copies the
bytes in, so the same tensors, in the same graph, read them again and gradients are bit-identical. The
(stage, mb)'s input and output stay: the executor keeps them on the device anyway. On CUDA both copies run on
a side stream from pinned memory, ``non_blocking``, and the backward's stream waits for the reload's event; on
CPU the same mechanism runs synchronously into a separate host store. The activation meter
(activation_memory.py) stops counting an offloaded storage until it is back: it counts device-resident bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ...actions import OFFLOAD, RELOAD, Action
from ..config import RunError
from .activation_memory import ActivationMeter, is_state, storage_of


@dataclass(kw_only=True)
class Moved:
    """The storages one (stage, mb) saved. Mutable: on the device, on the host, or reloading."""

    storages: dict = field(default_factory=dict)  #: storage key -> the device storage
    host: dict | None = None  #: storage key -> its host copy, from OFFLOAD until the backward waited
    event: object = None  #: CUDA: the reload's copies done
    offloaded: bool = False  #: the bytes are on the host (OFFLOAD ran, RELOAD not yet)


class _Packed:
    """A saved tensor of an offloaded (stage, mb): unpacked only once its bytes are back."""

    __slots__ = ("inner", "key", "owner")

    def __init__(self, inner, key, owner):
        self.inner, self.key, self.owner = inner, key, owner


class Offload:
    """The offloaded (stage, mb)s of one rank. Mutable: each one's storages, from its F to its backward."""

    def __init__(self, device: torch.device, stages: dict[int, nn.Module], meter: ActivationMeter | None = None):
        self.device, self.stages, self.meter = device, stages, meter
        self.live: dict[tuple[int, int], Moved] = {}
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self.live

    def saving(self, key: tuple[int, int]):
        """The forward of ``key`` = (stage, mb): record what autograd saves (counted by the meter, if any)."""
        moved = self.live[key] = Moved()
        state = {storage_of(t).data_ptr() for st in self.stages.values() for t in (*st.parameters(), *st.buffers())}
        inner_pack, inner_unpack = self.meter.count.packer(self.meter.params()) if self.meter is not None \
            else (None, None)

        def pack(t):
            if is_state(t, state) or t.device.type != self.device.type:
                return inner_pack(t) if inner_pack is not None else t
            storage = storage_of(t)
            moved.storages.setdefault(storage._cdata, storage)
            return _Packed(inner_pack(t) if inner_pack is not None else t, key, self)

        def unpack(p):
            if isinstance(p, _Packed):
                if self.live.get(p.key) is not None and self.live[p.key].offloaded:
                    raise RunError(f"the backward of {p.key[0]}F{p.key[1]} reads activations that "
                                   f"{_name(OFFLOAD, p.key)} moved to host memory: the program has no "
                                   f"{_name(RELOAD, p.key)} before it")
                p = p.inner
            return inner_unpack(p) if inner_unpack is not None else p

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def offload(self, key: tuple[int, int], keep=()) -> None:
        """OFFLOAD: the recorded storages to the host, except those of ``keep`` (the input and output)."""
        moved = self.live.get(key)
        if moved is None or moved.offloaded:
            raise RunError(f"{_name(OFFLOAD, key)} has no forward of {key[0]}F{key[1]} before it whose activations "
                           "are on the device")
        stay = {storage_of(t)._cdata for t in keep}
        moved.storages = {k: st for k, st in moved.storages.items()
                          if k not in stay and st.resizable() and st.nbytes()}
        compute = torch.cuda.current_stream(self.device) if self.stream is not None else None
        if self.stream is not None:
            self.stream.wait_stream(compute)  # the forward wrote them
        moved.host = {}
        for k, st in moved.storages.items():
            if self.stream is not None:
                with torch.cuda.stream(self.stream):
                    host = torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=True).untyped_storage()
                    host.copy_(st, non_blocking=True)
                    # the block stays the side stream's until its copy is done, though freed here
                    torch.empty(0, dtype=torch.uint8, device=self.device).set_(st).record_stream(self.stream)
            else:
                host = torch.UntypedStorage(st.nbytes())
                host.copy_(st)
            moved.host[k] = host
            st.resize_(0)
            if self.meter is not None:
                self.meter.count.moved(st, resident=False)
        moved.offloaded = True

    def reload(self, key: tuple[int, int]) -> None:
        """RELOAD: the storages back to the device (on CUDA: issued on the side stream)."""
        moved = self.live.get(key)
        if moved is None or not moved.offloaded:
            raise RunError(f"{_name(RELOAD, key)} has no {_name(OFFLOAD, key)} before it")
        if self.stream is not None:
            for st, host in zip(moved.storages.values(), moved.host.values()):
                st.resize_(host.nbytes())  # allocated on the compute stream, which frees it after the backward
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for st, host in zip(moved.storages.values(), moved.host.values()):
                    st.copy_(host, non_blocking=True)
                moved.event = self.stream.record_event()
        else:
            for st, host in zip(moved.storages.values(), moved.host.values()):
                st.resize_(host.nbytes())
                st.copy_(host)
        for st in moved.storages.values() if self.meter is not None else ():
            self.meter.count.moved(st, resident=True)
        moved.offloaded = False

    def ready(self, a: Action) -> None:
        """Before backward ``a`` (B or I) of an offloaded (stage, mb): its RELOAD ran (and on CUDA, ended)."""
        key = (a.stage, a.mb)
        moved = self.live.pop(key)
        if moved.offloaded:
            self.live[key] = moved
            raise RunError(f"{a} needs {_name(RELOAD, key)} before it: {_name(OFFLOAD, key)} moved its saved "
                           f"activations to host memory and the program brings them back nowhere before {a}")
        if moved.event is not None:
            torch.cuda.current_stream(self.device).wait_event(moved.event)


def _name(kind: str, key: tuple[int, int]) -> str:
    return str(Action(kind, *key))
