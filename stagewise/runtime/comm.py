"""Point-to-point messages between stages, derived from the programs.

A *route* is one message: the activation into stage ``s`` (sent by F of
``s-1``) or the gradient into stage ``s`` (sent by B or I of ``s+1``), for one
micro-batch. Sends are asynchronous (``isend``, waited at step end).
Receives from one sender are posted in the sender's own program order: when a
message is needed, it and every earlier one of that sender are posted, and the
next one is posted as soon as this one is taken, so its transfer overlaps the
compute. That order is what NCCL needs (no tags, FIFO per pair); gloo gets a
tag per route as well. Since the validator proves the programs executable with
asynchronous sends, no rank ever waits for a message whose sender is itself
waiting: deadlock-free by construction.

Shapes and dtypes are learned from the first step, whose messages each carry a
small header; the receiver checks every header, and from then on the sender
checks each tensor against the learned shape before it sends. Stages on the
same rank hand tensors over in memory.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..actions import actions_of
from ..schedule import Schedule
from .flight import FLUSH, GOT, NO_FLIGHT, POST, SEND, WAIT

ACT, GRAD = 0, 1
_WHAT = ("activation", "gradient")
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32)
_HEADER = 10  # ndim, up to 8 dims, dtype code


class ShapeError(RuntimeError):
    """A tensor between stages whose shape or dtype differs from the learned one."""


class CommTimeout(RuntimeError):
    """A message that did not arrive within the timeout."""


class Route(NamedTuple):
    """One message: ``direction`` (ACT or GRAD) into stage ``stage`` for micro-batch ``mb``."""

    direction: int
    stage: int
    mb: int

    @property
    def source(self) -> int:
        """The stage that sends it."""
        return self.stage - 1 if self.direction == ACT else self.stage + 1

    def describe(self) -> str:
        return f"the {_WHAT[self.direction]} of micro-batch {self.mb} from stage {self.source} to stage {self.stage}"


@dataclass(frozen=True, kw_only=True)
class MessagePlan:
    """Every cross-rank route, per (sender rank, receiver rank), in the sender's program order."""

    placement: tuple[int, ...]
    stages: int
    microbatches: int
    order: dict  #: (src, dst) -> tuple of Routes
    first: tuple[int, ...]  #: per stage, the first stage of its lane
    last: tuple[int, ...]  #: per stage, the last stage of its lane

    def tag(self, route: Route, header: bool = False) -> int:
        return ((header * 2 + route.direction) * self.stages + route.stage) * self.microbatches + route.mb


def message_plan(schedule: Schedule) -> MessagePlan:
    first, last = [0] * schedule.stages, [0] * schedule.stages
    for lane in schedule.lanes:
        for s in lane.stages:
            first[s], last[s] = lane.stage_lo, lane.stage_hi - 1
    place = schedule.placement
    order: dict[tuple[int, int], list[Route]] = defaultdict(list)
    for r, prog in enumerate(schedule.programs):
        for op in prog:
            for kind, s, mb in actions_of(op):
                if kind == "F" and s != last[s]:
                    route = Route(ACT, s + 1, mb)
                elif kind in ("B", "I") and s != first[s]:
                    route = Route(GRAD, s - 1, mb)
                else:
                    continue
                if place[route.stage] != r:
                    order[(r, place[route.stage])].append(route)
    return MessagePlan(placement=place, stages=schedule.stages, microbatches=schedule.microbatches,
                       order={k: tuple(v) for k, v in order.items()}, first=tuple(first), last=tuple(last))


class P2P:
    """One rank's messages. Mutable: posted receives, pending sends, learned shapes, channel positions."""

    def __init__(self, plan: MessagePlan, rank: int, device: torch.device, timeout_s: float, tags: bool = True,
                 base: int = 0):
        self.plan, self.rank, self.device = plan, rank, device
        self.base = base  # global rank of pipeline rank 0 (data parallel replicas: stagewise.runtime.dp)
        self.timeout = timedelta(seconds=timeout_s)
        self.tags = tags
        self.flight = NO_FLIGHT  # the rank's flight.Recorder: posts, waits and sends (set by the trainer)
        self.learning = True  # the first step carries headers
        self._shape: dict[tuple[int, int], tuple] = {}  # (direction, stage) -> (shape, dtype, mb it came with)
        self._pos: dict[int, int] = defaultdict(int)  # sender rank -> next route index to post
        self._posted: dict[Route, tuple] = {}
        self._local: dict[Route, torch.Tensor] = {}
        self._sends: list = []

    def send(self, route: Route, tensor: torch.Tensor) -> None:
        """Post ``tensor`` along ``route`` (or hand it over when the receiving stage is on this rank)."""
        self._check(route, tuple(tensor.shape), tensor.dtype, "sends")
        dst = self.plan.placement[route.stage]
        if dst == self.rank:
            self._local[route] = tensor
            return
        tensor = tensor.detach().contiguous()
        self.flight.event(SEND, _brief(route, self.base + dst))
        if self.learning:
            hdr = _encode(tensor, route).to(self.device)
            self._sends.append((dist.isend(hdr, self.base + dst, tag=self._tag(route, True)), hdr))
        self._sends.append((dist.isend(tensor, self.base + dst, tag=self._tag(route)), tensor))
        self._sends = [s for s in self._sends if not s[0].is_completed()]

    def recv(self, route: Route) -> torch.Tensor:
        """The tensor of ``route``, waiting for it if needed."""
        src = self.plan.placement[route.source]
        if src == self.rank:
            return self._local.pop(route)
        channel = self.plan.order[(src, self.rank)]
        while route not in self._posted:
            self._post(src, channel[self._pos[src]])
            self._pos[src] += 1
        work, buf = self._posted.pop(route)
        if not self.learning and self._pos[src] < len(channel):
            # keep the channel's next receive posted, so its transfer overlaps this op's compute
            self._post(src, channel[self._pos[src]])
            self._pos[src] += 1
        self._wait(work, route, self.base + src)
        return buf

    def finish_step(self) -> None:
        """Wait for this step's sends; the next step reuses the learned shapes."""
        self.flight.event(FLUSH, f"{len(self._sends)} sends in flight")
        for work, _ in self._sends:
            work.wait(self.timeout)
        self._sends, self._pos = [], defaultdict(int)
        if self._posted or self._local:
            left = next(iter(self._posted or self._local))
            raise RuntimeError(f"rank {self.rank}: {left.describe()} was never used; the programs disagree")
        self.learning = False

    def _post(self, src: int, route: Route) -> None:
        key = (route.direction, route.stage)
        if self.learning:
            hdr = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
            self._wait(dist.irecv(hdr, self.base + src, tag=self._tag(route, True)), route, self.base + src)
            shape, dtype = _decode(hdr.cpu())
            self._check(route, shape, dtype, "receives")
        shape, dtype, _ = self._shape[key]
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        self._posted[route] = (dist.irecv(buf, self.base + src, tag=self._tag(route)), buf)
        self.flight.event(POST, _brief(route, self.base + src))

    def _check(self, route: Route, shape: tuple, dtype, verb: str) -> None:
        key = (route.direction, route.stage)
        known = self._shape.setdefault(key, (shape, dtype, route.mb))
        if known[:2] != (shape, dtype):
            who = f"stage {route.source}" if verb == "sends" else f"stage {route.stage}"
            raise ShapeError(
                f"{who} micro-batch {route.mb}: {verb} {_WHAT[route.direction]} of shape {_fmt(shape, dtype)} "
                f"(stage {route.source} -> {route.stage}), but micro-batch {known[2]} had {_fmt(*known[:2])}; "
                "every micro-batch must have the same shape between stages")

    def _wait(self, work, route: Route, src: int) -> None:
        self.flight.event(WAIT, _brief(route, src))
        try:
            work.wait(self.timeout)
        except RuntimeError as e:
            if "imed out" in str(e) or "imeout" in str(e):
                raise CommTimeout(f"timed out after {self.timeout.total_seconds():g} s waiting for "
                                  f"{route.describe()} (rank {src})") from None
            raise
        self.flight.event(GOT, _brief(route, src))

    def _tag(self, route: Route, header: bool = False) -> int:
        return self.plan.tag(route, header) if self.tags else 0


def _brief(route: Route, peer: int) -> str:
    """A route in a flight record: ``activation mb 3, stage 0->1 (rank 0)``."""
    return f"{_WHAT[route.direction]} mb {route.mb}, stage {route.source}->{route.stage} (rank {peer})"


def _encode(t: torch.Tensor, route: Route) -> torch.Tensor:
    if t.dim() > _HEADER - 2 or t.dtype not in _DTYPES:
        raise ShapeError(f"{route.describe()}: cannot send a {t.dim()}-d {t.dtype} tensor (up to "
                         f"{_HEADER - 2} dims of {', '.join(map(str, _DTYPES))})")
    dims = list(t.shape) + [0] * (_HEADER - 2 - t.dim())
    return torch.tensor([t.dim(), *dims, _DTYPES.index(t.dtype)], dtype=torch.int64)


def _decode(h: torch.Tensor) -> tuple[tuple, torch.dtype]:
    vals = h.tolist()
    return tuple(vals[1:1 + vals[0]]), _DTYPES[vals[-1]]


def _fmt(shape, dtype) -> str:
    return f"({', '.join(map(str, shape))}) {str(dtype).replace('torch.', '')}"
