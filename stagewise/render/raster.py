"""Timelines too dense to draw action by action, as pixels.

Past a few thousand actions narrower than two pixels, one SVG rect per action
makes pages of tens of MB (zb-v at p=64, m=1024 has 393,216 actions) that no
one can see apart anyway. Here each rank's row becomes pixel columns: a
column's colour is the time-weighted mix of the action colours inside it and
its opacity the busy share, so idle time stays see-through (white), a dense
steady phase shows its blend of F and B, and widths stay to scale. Overlapped
F&B pairs paint the forward in the top half of the row and the backward in
the bottom half, as the vector pictures do.

Pure Python (zlib for the PNG), linear in actions: one pass over each rank's
program, no ``Cell`` objects.

Example:
    >>> from stagewise.costs import Costs
    >>> from stagewise.schedules import generate
    >>> from stagewise.simulate import simulate
    >>> tl = simulate(generate("1f1b", 2, 4), Costs())
    >>> strips = rank_strips(tl, columns=12, scale=1.0)
    >>> len(strips), len(strips[0].top)  # two ranks, 12 RGBA pixels each half
    (2, 48)
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from ..actions import HOST_KINDS, Pair
from ..timeline import Timeline
from . import palette
from .cells import chunk_of_stage, origin

#: at or past this many actions narrower than ``NARROW_PX``, a picture is drawn as pixels
DENSE_ACTIONS = 2000
#: a cell this narrow is mostly its white outline: its number does not fit and neighbours blur together
NARROW_PX = 2.0


class Strip(NamedTuple):
    """One rank's row as RGBA pixels: the top and the bottom half (equal unless F&B pairs)."""

    top: bytes
    bottom: bytes


def narrow_actions(timeline: Timeline, scale: float) -> int:
    """Ops narrower than ``NARROW_PX`` pixels at ``scale`` pixels per time unit."""
    if scale <= 0:
        return 0
    limit = NARROW_PX / scale
    return sum(1 for st, en in zip(timeline.starts, timeline.ends) for s, e in zip(st, en) if e - s < limit)


def is_dense(timeline: Timeline, scale: float) -> bool:
    """Whether a picture at ``scale`` has too many narrow actions to draw one by one."""
    if timeline.schedule.num_actions < DENSE_ACTIONS:
        return False
    return narrow_actions(timeline, scale) >= DENSE_ACTIONS


def rank_strips(timeline: Timeline, *, columns: int, scale: float) -> list[Strip]:
    """Per rank, ``columns`` RGBA pixels per half-row; pixel x covers time [x, x+1) / ``scale``."""
    sched = timeline.schedule
    chunk = chunk_of_stage(sched)
    fills = {(kind, c): palette.rgb(palette.colour(kind, c, sched.chunks))
             for kind in palette.KIND_ORDER for c in range(max(chunk, default=0) + 1)}
    t0 = origin(timeline)
    out = []
    for r in range(sched.ranks):
        whole = _Canvas(columns)
        halves = None
        for op, start, end in timeline.rows(r):
            x0, x1 = (start - t0) * scale, (end - t0) * scale
            if type(op) is Pair:
                halves = halves or (_Canvas(columns), _Canvas(columns))
                fa, ba = op
                halves[0].paint(fills[fa.kind, chunk[fa.stage]], x0, x1)
                halves[1].paint(fills[ba.kind, chunk[ba.stage]], x0, x1)
            elif op.kind not in HOST_KINDS:  # the host link's transfers are on the lane
                whole.paint(fills[op.kind, chunk[op.stage]], x0, x1)
        if halves is None:
            row = whole.pixels()
            out.append(Strip(row, row))
        else:
            out.append(Strip(whole.plus(halves[0]).pixels(), whole.plus(halves[1]).pixels()))
    return out


class _Canvas:
    """Per pixel column: colour-weighted busy time (red, green, blue) and busy time. Mutable: painted on."""

    def __init__(self, columns: int):
        self.columns = columns
        self.acc = [[0.0] * columns for _ in range(4)]

    def paint(self, rgb: tuple[int, int, int], x0: float, x1: float) -> None:
        """Add the time [x0, x1) (in pixels) of colour ``rgb`` to the columns it covers."""
        red, green, blue, busy = self.acc
        c0, c1 = int(x0), min(int(x1), self.columns - 1)
        r, g, b = rgb
        if c0 >= c1:  # within one pixel: the common case in a dense picture
            if c0 < self.columns:
                w = min(x1, c0 + 1.0) - x0
                red[c0] += w * r
                green[c0] += w * g
                blue[c0] += w * b
                busy[c0] += w
            return
        spans = [(c0, c0 + 1.0 - x0), *((c, 1.0) for c in range(c0 + 1, c1)), (c1, min(x1, c1 + 1.0) - c1)]
        for c, w in spans:
            red[c] += w * r
            green[c] += w * g
            blue[c] += w * b
            busy[c] += w

    def plus(self, other: "_Canvas") -> "_Canvas":
        both = _Canvas(self.columns)
        both.acc = [[a + b for a, b in zip(x, y)] for x, y in zip(self.acc, other.acc)]
        return both

    def pixels(self) -> bytes:
        """RGBA per column: colour = time-weighted mean of what ran in it, alpha = its busy share."""
        out = bytearray(4 * self.columns)
        red, green, blue, busy = self.acc
        for c, t in enumerate(busy):
            if t > 0:  # else idle: transparent
                out[4 * c:4 * c + 4] = bytes((round(red[c] / t), round(green[c] / t), round(blue[c] / t),
                                               round(255 * min(1.0, t))))
        return bytes(out)


def png(rows: list[bytes], width: int) -> bytes:
    """A PNG of RGBA ``rows`` (each ``4 * width`` bytes), top to bottom."""
    raw = b"".join(b"\x00" + row for row in rows)  # filter type 0 per row; zlib finds the repeats

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, len(rows), 8, 6, 0, 0, 0)  # 8-bit RGBA
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
