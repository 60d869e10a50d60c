"""The flight recorder: each rank's last events, kept where a crash cannot take them.

A ring buffer of fixed-size records (wall time, step, event, text) of the last
``capacity`` events of one rank: each op started and finished, each receive
posted, waited for and received, each send, each collective as the lowering names it
(``COMM``: ``1UNSHARD``, ``0REDUCE_GRAD``, ``1ALL_TO_ALL3``, ``0TIE_GRAD``, ``0STEP_END``; comm_actions.py),
the step-end flush and collectives, checkpoint saves. Under the local launcher the buffer is a shared
file mapping in the launcher's temporary folder: a rank that dies (``os._exit``,
a signal) or that the launcher terminates still leaves its last events there,
so the launcher can say which action the failed rank was at and print every
rank's last entries. Without a file (torchrun) the buffer lives in memory and a
failing rank prints its own.

Writing an event is one ``struct.pack_into`` (about a microsecond); no lock,
since each buffer has one writer and is read after that writer stopped.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path
from typing import Callable, NamedTuple

# event kinds
STEP, START, END, POST, WAIT, GOT, SEND, FLUSH, SYNC, SYNCED, SAVE, SAVED, COMM = range(13)
WORDS = ("step", "start", "end", "post", "wait", "got", "send", "flush", "sync", "synced", "save", "saved", "comm")

_HEAD = struct.Struct("<4sIQ")  # magic, capacity, events written so far
_REC = struct.Struct("<diB51s")  # time, step (1-based), kind, text: 64 bytes
_MAGIC = b"SWFR"


class Entry(NamedTuple):
    """One recorded event."""

    time: float  #: time.time() when it happened
    step: int  #: 1-based step (0 before the first)
    kind: int  #: one of STEP..COMM
    text: str  #: the op (``1F3``) or the message (``activation mb 3, stage 0->1 (rank 0)``)


class Recorder:
    """One rank's ring buffer. Mutable: the buffer and the current step.

    ``on_start(step, op)`` runs after an op's start is recorded (the fault injector of tests uses it).
    """

    def __init__(self, capacity: int = 256, path: str | os.PathLike | None = None,
                 on_start: Callable | None = None):
        self.path, self.on_start = path, on_start
        size = _HEAD.size + capacity * _REC.size
        if path is None:
            self.buf = bytearray(size)
            _HEAD.pack_into(self.buf, 0, _MAGIC, capacity, 0)
        else:
            self.buf = _mapped(Path(path), size, capacity)
        self.capacity = _HEAD.unpack_from(self.buf, 0)[1]
        self.count = _HEAD.unpack_from(self.buf, 0)[2]  # a second recorder on one file continues its ring
        self.step_no = 0
        #: this step's collectives: (perf_counter, text, None, op) when issued, (.., .., seconds waited, op) when
        #: done; op: the position of the op last started (-1: before the first)
        self.comms: list[tuple] = []
        self.op_no = -1

    def event(self, kind: int, text: str) -> None:
        slot = _HEAD.size + (self.count % self.capacity) * _REC.size
        _REC.pack_into(self.buf, slot, time.time(), self.step_no, kind, text.encode()[:51])
        self.count += 1
        struct.pack_into("<Q", self.buf, 8, self.count)

    def step(self, k: int) -> None:
        """Step ``k`` (0-based) begins."""
        self.step_no = k + 1
        self.event(STEP, f"step {k + 1}")

    def start(self, op) -> None:
        self.event(START, str(op))
        self.op_no += 1
        if self.on_start is not None:
            self.on_start(self.step_no, op)

    def end(self, op) -> None:
        self.event(END, str(op))

    def comm(self, text: str) -> None:
        """A collective issued: its lowered name (``1REDUCE_GRAD``), in the order the rank issues them."""
        self.event(COMM, text)
        self.issued(text)

    def issued(self, text: str) -> None:
        """A send or receive issued under its lowered name (``1SEND_F0``): on the measured trace's lanes, not in
        the ring (which has the message's own SEND and POST events)."""
        self.comms.append((time.perf_counter(), text, None, self.op_no))

    def done(self, text: str, waited: float) -> None:
        """Collective ``text`` is complete; the rank waited ``waited`` seconds for it (the measured trace's
        communication lanes: ``comms``; not in the ring)."""
        self.comms.append((time.perf_counter(), text, waited, self.op_no))

    def reset_comms(self) -> None:
        """A step begins: ``comms`` holds only its collectives (and ``op_no`` counts its ops)."""
        self.comms, self.op_no = [], -1

    def entries(self) -> list[Entry]:
        return _entries(self.buf)


class _Null:
    """A recorder that records nothing (the default of the executor and the messages)."""

    step_no = 0

    def event(self, kind: int, text: str) -> None:
        pass

    def step(self, k: int) -> None:
        pass

    def start(self, op) -> None:
        pass

    def end(self, op) -> None:
        pass

    comms = ()

    def comm(self, text: str) -> None:
        pass

    def issued(self, text: str) -> None:
        pass

    def done(self, text: str, waited: float) -> None:
        pass

    def reset_comms(self) -> None:
        pass


NO_FLIGHT = _Null()


def rank_file(folder: str | os.PathLike, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.flight"


def read(path: str | os.PathLike) -> list[Entry]:
    """The events in a rank's file, oldest first ([] when the rank never wrote one)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    return _entries(data) if len(data) >= _HEAD.size else []


def where(entries: list[Entry], waits: bool = True) -> str:
    """Where a rank was when it stopped: ``at 1F3 (step 2)`` (``waits``: and the message it waited for
    inside that op), or a step's phase: ``in the step-end collectives of step 2``. '' before any event."""
    if not entries:
        return ""
    last = next((e for e in reversed(entries) if e.kind != COMM), entries[-1])  # a collective: its phase's
    op = next((e for e in reversed(entries) if e.kind in (START, END)), None)
    if op is not None and op.kind == START:
        out = f"at {op.text} (step {op.step})"
        return f"{out}, waiting for the {last.text}" if waits and last.kind == WAIT else out
    phase = _PHASES.get(last.kind)
    if phase is None:
        return f"after {op.text} (step {op.step})" if op is not None else ""
    return f"{phase} of step {last.step}" if last.step else ""


_PHASES = {STEP: "at the start", FLUSH: "waiting for the last sends", SYNC: "in the step-end collectives",
           SAVE: "saving the checkpoint", WAIT: "waiting"}


def intervals(comms, origin: float) -> list[tuple]:
    """``Recorder.comms`` as (op, text, start, end, exposed) per collective that completed, seconds from
    ``origin`` (a perf_counter), in the order they were issued."""
    out, open_ = [], {}
    for t, text, waited, op in comms:
        if waited is None:
            open_[text] = (len(out), t, op)
            out.append(None)
        elif text in open_:
            j, t0, at = open_.pop(text)
            out[j] = (at, text, t0 - origin, t - origin, min(waited, t - t0))
    return [c for c in out if c is not None]


def dump(per_rank: dict[int, list[Entry]], failed: tuple[int, ...], last: int = 12, others: int = 6) -> str:
    """The failed ranks' last ``last`` events and every other rank's last ``others``, times relative to the
    failed rank's last event."""
    ends = [per_rank[r][-1].time for r in failed if per_rank.get(r)]
    origin = max(ends) if ends else max((es[-1].time for es in per_rank.values() if es), default=0.0)
    lines = []
    for r in sorted(per_rank, key=lambda r: (r not in failed, r)):
        es = per_rank[r]
        if not es:
            continue
        shown = es[-(last if r in failed else others):]
        tag = " (failed)" if r in failed else ""
        lines.append(f"flight recorder, rank {r}{tag}: last {len(shown)} events")
        lines += [f"  {e.time - origin:+9.4f} s  step {e.step:<3} {WORDS[e.kind]:<6} {e.text}" for e in shown]
    return "\n".join(lines)


def _mapped(path: Path, size: int, capacity: int):
    fresh = not path.exists()
    with open(path, "a+b") as f:
        if fresh:
            f.truncate(size)
        m = mmap.mmap(f.fileno(), 0)
    if fresh:
        _HEAD.pack_into(m, 0, _MAGIC, capacity, 0)
    return m


def _entries(buf) -> list[Entry]:
    magic, capacity, count = _HEAD.unpack_from(buf, 0)
    if magic != _MAGIC:
        return []
    n = min(count, capacity)
    out = []
    for i in range(count - n, count):
        t, step, kind, text = _REC.unpack_from(buf, _HEAD.size + (i % capacity) * _REC.size)
        out.append(Entry(t, step, kind, text.rstrip(b"\0").decode(errors="replace")))
    return out
