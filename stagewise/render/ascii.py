"""Timelines as text for the terminal (``stagewise simulate --draw``, ``draw`` without -o).

Time is scaled to the width: each column shows what its rank is doing at the
column's midpoint, so a picture of any size fits and keeps its proportions.
A cell wide enough gets its kind and micro-batch (``F3``; lowercase for the
second and later chunks of a rank), a narrower one its kind letter; idle
columns are ``.``. With expert-parallel all-to-all, a line under each row is
its lane: ``=`` where the all-to-all runs behind compute, ``#`` where the rank
waits for it. Colour (24-bit
background per kind and chunk) only when asked, or by default when stdout is
a terminal and ``NO_COLOR`` is unset.
"""

from __future__ import annotations

import os
import sys
from bisect import bisect_right

from ..timeline import Timeline
from . import palette
from .cells import Cell, CommCell, cells, comm_cells, summary, unit_label

IDLE = "."
RESET = "\x1b[0m"


def use_colour(stream=None) -> bool:
    """Colour when the stream is a TTY and NO_COLOR is unset (https://no-color.org)."""
    stream = stream or sys.stdout
    return not os.environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty()


def draw_text(timeline: Timeline, *, width: int | None = None, color: bool | None = None) -> str:
    """The timeline as lines no wider than ``width`` (default: the terminal's)."""
    import shutil  # here: its archive imports are a tenth of the CLI's start-up

    width = width or shutil.get_terminal_size().columns
    color = use_colour() if color is None else color
    sm = summary(timeline)
    label_w = len(f"rank {timeline.ranks - 1} ")
    cols = max(1, width - label_w - 1)
    scale = cols / sm.makespan if sm.makespan > 0 else 0.0
    by_rank: list[list[Cell]] = [[] for _ in range(timeline.ranks)]
    for c in cells(timeline):
        by_rank[c.rank].append(c)
    lanes: list[list[CommCell]] = [[] for _ in range(timeline.ranks)]
    for c in comm_cells(timeline):
        lanes[c.rank].append(c)
    lines = [_fit(sm.title, width), _fit(sm.subtitle, width)]
    for r, row in enumerate(by_rank):
        body = _row(row, cols, scale, timeline.schedule.chunks, color, timeline.schedule.slices)
        lines.append(f"{f'rank {r}':<{label_w}}|" + body)
        if sm.comm or sm.transfers:
            lines.append(f"{'':<{label_w}}:" + _lane(lanes[r], cols, scale))
    lines.append(_axis(label_w, cols, sm.makespan, sm.unit))
    lines += _wrap(_legend(sm.kinds, sm.chunks, sm.pairs, sm.comm, sm.transfers), width)
    return "\n".join(lines)


def _wrap(parts: list[str], width: int) -> list[str]:
    """Legend items two spaces apart, on as many lines of ``width`` as they need."""
    out = [""]
    for p in parts:
        if out[-1] and len(out[-1]) + 2 + len(p) > width:
            out.append("")
        out[-1] = _fit(f"{out[-1]}  {p}" if out[-1] else p, width)
    return out


def _lane(lane: list[CommCell], cols: int, scale: float) -> str:
    """One rank's communication lane: '=' hidden behind compute, '#' exposed, ' ' none (column midpoints)."""
    lane = sorted(lane, key=lambda c: c.start)
    starts = [c.start for c in lane]
    out = []
    for col in range(cols):
        t = (col + 0.5) / scale if scale else 0.0
        i = bisect_right(starts, t) - 1
        c = lane[i] if i >= 0 and lane[i].end > t else None
        out.append(" " if c is None else "#" if t >= c.end - c.exposed else "=")
    return "".join(out).rstrip()


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "~"


def _row(row: list[Cell], cols: int, scale: float, chunks: int, color: bool, slices: int = 1) -> str:
    """One rank's columns: sample each column's midpoint, then write labels that fit (micro-batch.slice with
    slices)."""
    whole = [c for c in row if c.part != 2]  # a pair shows as its forward half, labelled with both mbs
    partner = {id(top): bottom for top, bottom in zip(row, row[1:]) if top.part == 1}
    starts = [c.start for c in whole]
    owner: list[Cell | None] = []
    for col in range(cols):
        t = (col + 0.5) / scale if scale else 0.0
        i = bisect_right(starts, t) - 1
        owner.append(whole[i] if i >= 0 and whole[i].end > t else None)
    chars = [IDLE if c is None else _letter(c) for c in owner]
    col = 0
    while col < cols:  # label each run of columns one cell owns, when the label fits
        c, run = owner[col], 1
        while col + run < cols and owner[col + run] is c:
            run += 1
        if c is not None:
            text = _letter(c) + unit_label(c.action.mb, slices)
            if id(c) in partner:
                text += "/" + unit_label(partner[id(c)].action.mb, slices)
            if run >= len(text):
                chars[col:col + run] = text + " " * (run - len(text))
        col += run
    chars = chars[:cols]
    if not color:
        return "".join(chars)
    out, prev = [], object()
    for ch, c in zip(chars, owner):
        if c is not prev:  # escape codes only where the cell changes
            out.append(_style(c, chunks))
            prev = c
        out.append(ch)
    return "".join(out) + RESET


def _letter(c: Cell) -> str:
    kind = "P" if c.part == 1 else c.action.kind  # P: an overlapped F&B pair
    return kind.lower() if c.chunk > 0 else kind


def _style(c: Cell | None, chunks: int) -> str:
    if c is None:
        return RESET
    fill = palette.colour(c.action.kind if c.part != 1 else "F", c.chunk, chunks)
    r, g, b = palette.rgb(fill)
    fr, fg, fb = palette.rgb(palette.text_colour(fill))
    return f"\x1b[48;2;{r};{g};{b}m\x1b[38;2;{fr};{fg};{fb}m"


def _axis(label_w: int, cols: int, span: float, unit: str) -> str:
    left = f"{0:g}"
    right = f"{span:.4g} {unit}"
    gap = max(1, cols - len(left) - len(right))
    return " " * label_w + "|" + left + " " * gap + right


def _legend(kinds, chunks: int, pairs: bool, comm: bool = False, transfers: bool = False) -> list[str]:
    parts = [palette.KIND_LABELS[k] for k in kinds]
    if pairs:
        parts.append("P3/5 F&B pair (forward mb/backward mb)")
    if comm or transfers:
        what = "communication" if transfers else "all-to-all"
        parts.append(f"under a row, {what}: = hidden # exposed")
    if chunks > 1:
        parts.append("lowercase: chunk >= 1")
    parts.append(". idle; digits: micro-batch")
    return parts
