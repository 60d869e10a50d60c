"""Point-to-point messages between stages: the lowered programs' SENDs and RECVs.

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

A message is a pytree of tensors (pytree.py). Its structure, shapes and dtypes
are learned from a small header, sent right before the data on the same
channel: the lowered program says which messages carry one (its
``SEND_F_HDR``/``RECV_F_HDR`` actions: the first of each boundary in a step, or
every message when the micro-batches of a step differ in shape, or none once
static shapes are learned), so headers and data always travel in one order.
The receiver checks every header, and the sender checks each message against
what it learned before it sends, so a micro-batch that differs (in shape, where
the step's micro-batches share one; in structure or dtype, always) is named
with the leaf and both shapes. Stages on the same rank hand tensors over in
memory (``hand_over``, checked alike).
"""

from __future__ import annotations

import builtins
import io
import pickle
import sys
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, is_dataclass
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from ...comm_actions import HEADERS, P2P as P2P_KINDS, RECVS, CommAction
from ...lowering.rules import message_in, message_out
from ..stages import pytree
from ...errors import StagewiseError
from ..resilience.flight import FLUSH, GOT, NO_FLIGHT, POST, SEND, WAIT

ACT, GRAD = 0, 1
_WHAT = ("activation", "gradient")
_HEADER_BYTES = 2048  # a pickled (structure, leaf shapes) fits; checked on send
_LEAF_TAGS = 256  # gloo tags: one per tensor leaf of a route
_CONST = "const"  # a leaf that is not a tensor travels in the header
_HEADER = "header"  # a posted receive that is still a header


class ShapeError(StagewiseError):
    """A tensor between stages whose shape or dtype differs from the learned one (the model's input: exit 2)."""


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
class Channels:
    """One rank's messages, read from its lowered program: per peer, what it receives from it, in the order
    its RECVs take them (the sender's program order: NCCL's FIFO per pair), and which messages carry a header."""

    inbound: dict  #: peer pipeline rank -> tuple of Routes, in the order they are received
    stages: int
    microbatches: int
    #: the routes whose message carries a header (the program's header actions), sent or received; a route
    #: without one has the shapes of its (direction, stage)'s last header (the sender checks each one)
    headed: frozenset = frozenset()
    varying: bool = False  #: every message carries its own header: shapes may differ between micro-batches

    def tag(self, route: Route, header: bool = False) -> int:
        return ((header * 2 + route.direction) * self.stages + route.stage) * self.microbatches + route.mb


def route_of(c) -> Route:
    """The route of a lowered SEND or RECV (``comm_actions.CommAction``)."""
    return _route(c.key)


def route_in(a, first, last) -> Route | None:
    """What action ``a`` needs from another stage (the lowering's rule, ``lowering.rules.message_in``) as a
    Route. ``first``/``last``: per stage, the first and last stage of its lane."""
    got = message_in(a, first, last)
    return None if got is None else _route(got[0])


def route_out(a, first, last) -> Route | None:
    """What action ``a`` hands on (``lowering.rules.message_out``): F its output, B or I its input gradient."""
    key = message_out(a, first, last)
    return None if key is None else _route(key)


def _route(key: tuple) -> Route:
    d, s, mb = key
    return Route(ACT if d == "F" else GRAD, s, mb)


def channels(program, stages: int, microbatches: int) -> Channels:
    """The ``Channels`` of one rank's lowered program (its SENDs and RECVs, with their peers, and the
    messages its header actions say carry a header)."""
    ways: dict[tuple[str, int], list[Route]] = {}
    headed = set()
    for c in program:
        if type(c) is CommAction:
            if c.kind in P2P_KINDS:
                ways.setdefault((c.kind in RECVS, c.peer), []).append(route_of(c))
            elif c.kind in HEADERS:
                headed.add(route_of(c))
    every = {r for routes in ways.values() for r in routes}
    return Channels(inbound={peer: tuple(routes) for (recv, peer), routes in ways.items() if recv},
                    stages=stages, microbatches=microbatches, headed=frozenset(headed),
                    varying=bool(every) and every <= headed)


class P2P:
    """One rank's messages. Mutable: posted receives, pending sends, learned shapes, channel positions.

    A message is a pytree (pytree.py): one message per tensor leaf, those the plan heads (``Channels.headed``)
    preceded by a header (its structure, and each leaf's shape, dtype and whether it carries a gradient,
    pickled; small CPU data rides inside). ``plan`` may change between steps (the pipeline picks the
    lowered program of each: headers on the first messages, on every one, or none); with ``static`` shapes
    what was learned is kept across steps and checked.
    """

    def __init__(self, plan: Channels, rank: int, device: torch.device, timeout_s: float, tags: bool = True,
                 peers: tuple[int, ...] | None = None, static: bool = True, flight=NO_FLIGHT):
        self.plan, self.rank, self.device = plan, rank, device
        # the global rank of each pipeline rank (parallel/mesh.py: this pipeline within the grid of ranks)
        self.peers = tuple(peers) if peers is not None else range(1 << 30)  # one pipeline: the same ranks
        self.timeout = timedelta(seconds=timeout_s)
        self.tags = tags
        self.static = static
        self.flight = flight  # the rank's flight.Recorder: posts, waits and sends
        self._shape: dict[tuple[int, int], tuple] = {}  # (direction, stage) -> (spec, metas, mb, step learned)
        self.steps = 0  # steps finished (a shape learned in an earlier one is named so)
        self._pos: dict[int, int] = defaultdict(int)  # sender rank -> next route index to post
        self._posted: dict[Route, tuple] = {}
        self._sends: list = []

    def hand_over(self, route: Route, tree):
        """``tree`` for a stage on this rank: checked as a message would be, handed over in memory (detached)."""
        leaves, spec = pytree.flatten(tree)
        self._check(route, spec, tuple(_meta(x) for x in leaves), "sends")
        return pytree.detached(tree)

    def send(self, route: Route, tree, dst: int, name: str = "") -> None:
        """Post ``tree`` (a tensor or a pytree of them) along ``route`` to pipeline rank ``dst``; ``name``: the
        lowered SEND's (``0SEND_F1``), told to the flight recorder as done once its messages are seen complete."""
        leaves, spec = pytree.flatten(tree)
        metas = tuple(_meta(x) for x in leaves)
        self._check(route, spec, metas, "sends")
        self.flight.event(SEND, _brief(route, self.peers[dst]))
        tensors = [t.detach() for t in leaves if isinstance(t, torch.Tensor)]
        works = []
        if route in self.plan.headed:
            hdr, inline = _encode(spec, metas, tensors, route)
            works.append((dist.isend(hdr.to(self.device), self.peers[dst], tag=self._tag(route, True)), hdr))
            if inline:  # the data rode in the header
                tensors = []
        for k, x in enumerate(tensors):
            x = x.detach().contiguous()
            works.append((dist.isend(x, self.peers[dst], tag=self._tag(route, leaf=k)), x))
        self._sends.append((name, works))
        pending = []
        for sent in self._sends:
            if all(w.is_completed() for w, _ in sent[1]):
                if sent[0]:
                    self.flight.done(sent[0], 0.0)
            else:
                pending.append(sent)
        self._sends = pending

    def post(self, route: Route, src: int) -> None:
        """A RECV: post the receive of ``route`` from pipeline rank ``src`` (and of every earlier message of
        its channel not posted yet: ``src``'s order) without waiting for it."""
        channel = self.plan.inbound[src]
        while route not in self._posted:
            self._post(src, channel[self._pos[src]])
            self._pos[src] += 1

    def recv(self, route: Route, src: int):
        """The pytree of ``route`` from pipeline rank ``src``, waiting for it if needed (floating leaves that
        carried a gradient need one)."""
        channel = self.plan.inbound[src]
        self.post(route, src)
        posted = self._posted.pop(route)
        if posted[0] == _HEADER:  # this step's header came first: now the data, in the shapes it gives
            self._wait(posted[1], route, self.peers[src])
            posted = self._post_data(src, route, *self._learn(route, posted[2]))
        if self._pos[src] < len(channel) and (self.tags or channel[self._pos[src]] not in self.plan.headed):
            # keep the channel's next receive posted, so its transfer overlaps this op's compute (a header
            # ahead of this route's data needs tags: NCCL matches a pair's messages in order)
            self._post(src, channel[self._pos[src]])
            self._pos[src] += 1
        works, spec, leaves, metas = posted
        for work in works:
            self._wait(work, route, self.peers[src])
        for x, m in zip(leaves, metas):
            if m[0] != _CONST and m[2]:
                x.requires_grad_()  # only once received: the receive writes into the buffer
        self._promote(src, channel)
        return pytree.unflatten(spec, leaves)

    def _promote(self, src: int, channel: tuple) -> None:
        """The header posted ahead has arrived: post its data now, so the transfer overlaps the next compute."""
        ahead = channel[self._pos[src] - 1] if self._pos[src] else None
        posted = self._posted.get(ahead)
        if posted is not None and posted[0] == _HEADER and posted[1].is_completed():
            self._wait(posted[1], ahead, self.peers[src])
            self._posted[ahead] = self._post_data(src, ahead, *self._learn(ahead, posted[2]))

    def finish_step(self) -> None:
        """Wait for this step's sends; the next step reuses the learned shapes (static) or learns them anew."""
        self.flight.event(FLUSH, f"{len(self._sends)} sends in flight")
        for name, works in self._sends:
            t0 = time.perf_counter()
            for work, _ in works:
                work.wait(self.timeout)
            if name:
                self.flight.done(name, time.perf_counter() - t0)
        self._sends, self._pos = [], defaultdict(int)
        if self._posted:
            left = next(iter(self._posted))
            raise RuntimeError(f"rank {self.rank}: {left.describe()} was never used; the programs disagree")
        self.steps += 1
        if not self.static:
            self._shape.clear()

    def _post(self, src: int, route: Route) -> None:
        """Post the receive of ``route``: its header when it has one this step (gloo: without waiting), else
        its data in the shapes its key's header gave."""
        if route in self.plan.headed:
            hdr = torch.empty(_HEADER_BYTES, dtype=torch.uint8, device=self.device)
            work = dist.irecv(hdr, self.peers[src], tag=self._tag(route, True))
            if self.tags:
                self._posted[route] = (_HEADER, work, hdr)
                self.flight.event(POST, _brief(route, self.peers[src]))
                return
            self._wait(work, route, self.peers[src])
            self._posted[route] = self._post_data(src, route, *self._learn(route, hdr))
        else:
            key = (route.direction, route.stage)
            if key not in self._shape:  # its key's header is posted but not read yet: read it first
                self._resolve(src, key)
            self._posted[route] = self._post_data(src, route, *self._shape[key][:2])
        self.flight.event(POST, _brief(route, self.peers[src]))

    def _resolve(self, src: int, key: tuple) -> None:
        first = next(r for r, p in self._posted.items() if (r.direction, r.stage) == key and p[0] == _HEADER)
        _, work, hdr = self._posted[first]
        self._wait(work, first, self.peers[src])
        self._posted[first] = self._post_data(src, first, *self._learn(first, hdr))

    def _learn(self, route: Route, hdr: torch.Tensor) -> tuple:
        """(structure, leaf metas, inline data or None) of a received header, checked against this step's."""
        spec, metas, inline = _decode(hdr.cpu())
        self._check(route, spec, metas, "receives")
        return spec, metas, inline

    def _post_data(self, src: int, route: Route, spec, metas, inline=None) -> tuple:
        works, leaves, k = [], [], 0
        data = iter(inline or ())
        for m in metas:
            if m[0] == _CONST:
                leaves.append(m[1])
                continue
            if inline is not None:
                leaves.append(_from_bytes(next(data), m[0], m[1]).to(self.device))
                continue
            buf = torch.empty(m[0], dtype=m[1], device=self.device)
            works.append(dist.irecv(buf, self.peers[src], tag=self._tag(route, leaf=k)))
            leaves.append(buf)
            k += 1
        return works, spec, leaves, metas

    def _check(self, route: Route, spec, metas: tuple, verb: str) -> None:
        key = (route.direction, route.stage)
        varying = self.plan.varying
        known = self._shape.setdefault(key, (spec, metas, route.mb, self.steps))
        if known[0] != spec or _kinds(known[1], varying) != _kinds(metas, varying):
            who = f"stage {route.source}" if verb == "sends" else f"stage {route.stage}"
            earlier = known[3] != self.steps  # learned in an earlier step: static shapes were promised
            rule = ("with static_shapes every step must have the shapes of the first" if earlier else
                    "every micro-batch of a step must have the same structure and dtypes between stages" if varying
                    else "every micro-batch of a step must have the same structure, shapes and dtypes between stages")
            raise ShapeError(f"{who} micro-batch {route.mb}: {verb} {_WHAT[route.direction]} "
                             f"(stage {route.source} -> {route.stage}) "
                             f"{_difference(known, spec, metas, earlier, varying)}; {rule}")

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

    def _tag(self, route: Route, header: bool = False, leaf: int = 0) -> int:
        return self.plan.tag(route, header) * _LEAF_TAGS + leaf if self.tags else 0


def _brief(route: Route, peer: int) -> str:
    """A route in a flight record: ``activation mb 3, stage 0->1 (rank 0)``."""
    return f"{_WHAT[route.direction]} mb {route.mb}, stage {route.source}->{route.stage} (rank {peer})"


def _meta(x) -> tuple:
    """A leaf as the header carries it: (shape, dtype, carries a gradient) or (_CONST, value)."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype, pytree.needs_grad(x))
    return (_CONST, x)


def _encode(spec, metas: tuple, tensors: list, route: Route) -> tuple[torch.Tensor, bool]:
    """The header of a message, and whether its data rides in it: small CPU tensors do (one message, no
    round trip for a header before the data). What the receiver would refuse to read is refused here, on the
    sender, naming it."""
    if len(tensors) > _LEAF_TAGS:
        raise ShapeError(f"{route.describe()}: {len(tensors)} tensors in one boundary; at most {_LEAF_TAGS}")
    inline = all(t.device.type == "cpu" for t in tensors) and sum(t.nbytes for t in tensors) < _HEADER_BYTES // 2
    if inline:
        data = pickle.dumps((spec, metas, [_to_bytes(t) for t in tensors]))
        inline = len(data) + 4 <= _HEADER_BYTES
    if not inline:
        data = pickle.dumps((spec, metas, None))
        if len(data) + 4 > _HEADER_BYTES:
            raise ShapeError(f"{route.describe()}: its structure takes {len(data)} bytes to describe (at most "
                             f"{_HEADER_BYTES - 4}); pass fewer leaves, or put constants outside the boundary")
    try:
        _Header.loads(data)  # what the receiver reads: refused here first
    except pickle.UnpicklingError as e:
        raise ShapeError(f"{route.describe()}: {e}") from None
    return _pack(data), inline


def _pack(data: bytes) -> torch.Tensor:
    buf = bytearray(_HEADER_BYTES)
    buf[:4] = len(data).to_bytes(4, "little")
    buf[4:4 + len(data)] = data
    return torch.frombuffer(buf, dtype=torch.uint8)


def _decode(h: torch.Tensor) -> tuple:
    raw = bytes(h.numpy())
    return _Header.loads(raw[4:4 + int.from_bytes(raw[:4], "little")])


class _Header(pickle.Unpickler):
    """Reads a header admitting only the types a header names: torch dtypes, a few builtin constructors, and
    the classes of a tree's nodes (``pytree``: NamedTuples, dataclasses, mappings) from modules this process
    has already imported, so reading one imports nothing and calls nothing else."""

    _BUILTINS = frozenset({"complex", "slice", "range", "set", "frozenset", "bytearray"})

    @classmethod
    def loads(cls, data: bytes) -> tuple:
        return cls(io.BytesIO(data)).load()

    def find_class(self, module: str, name: str):
        if module == "builtins" and name in self._BUILTINS:
            return getattr(builtins, name)
        found = sys.modules.get(module)
        for part in name.split(".") if found is not None else ():
            found = getattr(found, part, None)
        if isinstance(found, torch.dtype) or (isinstance(found, type) and _a_node_type(found)):
            return found
        raise pickle.UnpicklingError(f"a message header names {module}.{name}, which is not a torch dtype or a "
                                     "NamedTuple, dataclass or mapping class of an imported module; only tensors, "
                                     "numbers, strings and those may cross a stage boundary")


def _a_node_type(cls: type) -> bool:
    """A class ``pytree`` flattens a tree node of."""
    return (issubclass(cls, tuple) and hasattr(cls, "_fields")) or is_dataclass(cls) \
        or issubclass(cls, Mapping)


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_bytes(data: bytes, shape: tuple, dtype) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _kinds(metas: tuple, varying: bool) -> tuple:
    """The leaves as compared between micro-batches: whole, or without their shapes where those may vary."""
    return tuple((m[1], m[2]) if varying and m[0] != _CONST else m for m in metas) if varying else metas


def _difference(known: tuple, spec, metas: tuple, earlier: bool = False, varying: bool = False) -> str:
    """What differs from the learned message: its structure, or the first leaf whose shape or dtype does."""
    had = f"micro-batch {known[2]} of step {known[3] + 1} had" if earlier else f"micro-batch {known[2]} had"
    if known[0] != spec or len(known[1]) != len(metas):
        return f"as {pytree.describe(spec)}, but {had} {pytree.describe(known[0])} (structures differ)"
    for name, old, new in zip(pytree.paths(spec), known[1], metas):
        if _kinds((old,), varying) != _kinds((new,), varying):
            leaf = f"whose leaf {name} is" if name else "of shape"
            return f"{leaf} {_fmt_meta(new)}, but {had} {_fmt_meta(old)}"
    return "differently"


def _fmt_meta(m: tuple) -> str:
    if m[0] == _CONST:
        return f"the constant {m[1]!r}"
    text = f"({', '.join(map(str, m[0]))}) {str(m[1]).replace('torch.', '')}"
    return text + (" with gradient" if m[2] else "")
