"""Timelines as SVG text, in pure Python (no matplotlib).

Fast enough for the HTML report, the workshop page and Jupyter's
``_repr_svg_``: one ``<rect class="a KIND cCHUNK">`` per action with a
``<title>`` tooltip, idle time left blank, micro-batch numbers where they fit.
A timeline with thousands of actions narrower than a pixel is drawn as one
embedded PNG of pixel columns instead (``raster.py``), and its memory curve as
one step per pixel, so zb-v at p=64, m=1024 stays a page of a few hundred KB.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Sequence

from ..timeline import Timeline
import base64

from . import palette, raster
from .cells import (TOP, WHOLE, Summary, cells, comm_cells, comm_colours, comm_label, exposed_spans, memory_envelope, memory_steps, summary,
                    tick_label, ticks, tooltip, unit_label)

ROW = 22  #: row height (px)
GAP = 4  #: space between rows
LEFT = 62  #: room for rank labels
RIGHT = 14
FONT = 11
DIGIT = 6.6  #: width of one digit at FONT (px), to decide whether a label fits
MIN_FONT = 7  #: smallest micro-batch number worth printing (px)
MEM_ROW = 16  #: height of one rank's strip in the memory panel
LANE = 5  #: height of a rank's all-to-all lane, under its row
HATCH = (f'<defs><pattern id="a2a-hatch" patternUnits="userSpaceOnUse" width="5" height="5" '
         f'patternTransform="rotate(45)"><path d="M0 0V5" stroke="{palette.INK}" stroke-width="1.3"/>'
         "</pattern></defs>")


def pitch(timeline: Timeline) -> float:
    """Height of one rank's row with its gap (and its all-to-all lane, when there is one)."""
    return ROW + GAP + (LANE + 1 if timeline.comm is not None else 0)


@dataclass(frozen=True, kw_only=True)
class Frame:
    """Maps time to x for one picture: all panels of a comparison share it."""

    width: float
    span: float

    def x(self, t: float) -> float:
        return LEFT + t * self.scale

    @property
    def scale(self) -> float:
        return (self.width - LEFT - RIGHT) / self.span if self.span > 0 else 0.0


def timeline_svg(timeline: Timeline, *, width: int = 900, memory: bool = False, title: str | None = None,
                 standalone: bool = True) -> str:
    """The timeline as one SVG document (``standalone=False``: for inline HTML)."""
    sm = summary(timeline)
    frame = Frame(width=width, span=sm.makespan)
    out: list[str] = []
    y = _title(out, title if title is not None else sm.title, sm.subtitle)
    y = _rows(out, timeline, frame, y)
    y = _axis(out, frame, y, sm.unit)
    if memory:
        y = _memory(out, timeline, frame, y + 8)
    y = _legend(out, [sm], y + 4, width)
    return _document(out, width, y + 6, standalone)


def compare_svg(timelines: Sequence[Timeline], *, width: int = 900, standalone: bool = True) -> str:
    """Several timelines stacked on one shared time axis, with a table of bubble and peak."""
    sums = [summary(tl) for tl in timelines]
    frame = Frame(width=width, span=max((s.makespan for s in sums), default=0.0))
    out: list[str] = []
    y = _title(out, "same p, m and costs, one time axis", _shared(sums))
    for tl, sm in zip(timelines, sums):
        out.append(f'<text x="{LEFT}" y="{y + 13}" font-weight="bold">{escape(sm.name)}'
                   f'<tspan font-weight="normal" fill="{palette.MUTED}"> v={sm.chunks}  bubble {sm.bubble:.1%}  '
                   f'peak {sm.peak_max:g}{_comm_text(sm)}</tspan></text>')
        y = _rows(out, tl, frame, y + 18)
    y = _axis(out, frame, y, sums[0].unit if sums else "")
    y = _table(out, sums, y + 8)
    y = _legend(out, sums, y + 4, width)
    return _document(out, width, y + 6, standalone)


def _comm_text(sm: Summary) -> str:
    return f"  exposed a2a {sm.a2a_exposed:.4g} ({sm.a2a_hidden:.0%} hidden)" if sm.comm else ""


def _shared(sums: Sequence[Summary]) -> str:
    if not sums:
        return "no timelines"
    s = sums[0]
    return f"p={s.ranks} m={s.microbatches}; times in {s.unit}; {s.source}"


def _document(body: list[str], width: float, height: float, standalone: bool) -> str:
    ns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    head = (f'<svg{ns} class="stagewise" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" '
            f'font-size="{FONT}" fill="{palette.INK}">')
    defs = [HATCH] if any("url(#a2a-hatch)" in x for x in body) else []
    return "\n".join([head, *defs, f'<rect class="bg" width="100%" height="100%" fill="{palette.IDLE}"/>', *body,
                      "</svg>"]) + "\n"


def _title(out: list[str], title: str, subtitle: str) -> float:
    out.append(f'<text x="{LEFT}" y="16" font-size="14" font-weight="bold">{escape(title)}</text>')
    out.append(f'<text x="{LEFT}" y="31" fill="{palette.MUTED}">{escape(subtitle)}</text>')
    return 40.0


def _rows(out: list[str], timeline: Timeline, frame: Frame, y0: float) -> float:
    """Rank rows with one rect per action; returns the y below the last row."""
    ranks = timeline.ranks
    chunks = timeline.schedule.chunks
    x0, x1 = frame.x(0), frame.x(frame.span)
    step = pitch(timeline)
    for r in range(ranks):
        y = y0 + r * step
        out.append(f'<text x="{LEFT - 6}" y="{y + ROW / 2 + 4:.1f}" text-anchor="end">rank {r}</text>')
        out.append(f'<path class="row" d="M{x0:.1f} {y:.1f}H{x1:.1f}V{y + ROW:.1f}H{x0:.1f}Z" '
                   f'fill="none" stroke="{palette.GRID}" stroke-width="0.6"/>')
    if raster.is_dense(timeline, frame.scale):
        return _dense_rows(out, timeline, frame, y0)
    labels: dict[str, list[str]] = {}
    scale = frame.scale
    unit, slices = timeline.unit, timeline.schedule.slices
    out.append(f'<g class="cells" stroke="{palette.IDLE}" stroke-width="0.5">')
    rank = -1
    cells_ = cells(timeline)
    for c in cells_:  # rank by rank: one <g> per row keeps each rect short
        if c.rank != rank:
            out.append(("</g>" if rank >= 0 else "") + f'<g transform="translate(0 {y0 + c.rank * step:.1f})">')
            rank = c.rank
        a = c.action
        fill = palette.colour(a.kind, c.chunk, chunks)
        x, w = frame.x(c.start), (c.end - c.start) * scale
        y, h = (0.0, ROW) if c.part == WHOLE else (0.0 if c.part == TOP else ROW / 2, ROW / 2)
        ya = f' y="{y:g}"' if y else ""
        out.append(f'<rect class="a {a.kind} c{c.chunk}" x="{x:.2f}"{ya} width="{w:.2f}" height="{h:g}" '
                   f'fill="{fill}"><title>{tooltip(c, unit, slices)}</title></rect>')
        text = unit_label(a.mb, slices)
        size = min(FONT if h == ROW else FONT - 2, (w - 2) / (len(text) * DIGIT / FONT))
        if size >= MIN_FONT:  # shrink the number to fit its cell, down to MIN_FONT
            fs = "" if size == FONT else f' font-size="{size:.3g}"'
            yy = y0 + c.rank * step + y + h / 2 + size * 0.36
            labels.setdefault(palette.text_colour(fill), []).append(
                f'<text x="{x + w / 2:.1f}" y="{yy:.1f}"{fs}>{text}</text>')
    out.append("</g></g>" if rank >= 0 else "</g>")
    pairs = [c for c in cells_ if c.part == TOP]
    if pairs:  # outline each F&B pair so its two halves read as one overlapped cell
        d = "".join(f"M{frame.x(c.start):.2f} {y0 + c.rank * step:.1f}h{(c.end - c.start) * scale:.2f}"
                    f"v{ROW}h{-(c.end - c.start) * scale:.2f}Z" for c in pairs)
        out.append(f'<path class="pairs" d="{d}" fill="none" stroke="{palette.INK}" stroke-width="0.8"/>')
    for ink, texts in labels.items():
        out.append(f'<g class="mb" fill="{ink}" text-anchor="middle">')
        out.extend(texts)
        out.append("</g>")
    _comm(out, timeline, frame, y0, step)
    return y0 + ranks * step


def _comm(out: list[str], timeline: Timeline, frame: Frame, y0: float, step: float) -> None:
    """Each rank's all-to-all lane (pale where hidden behind compute) and the exposed part hatched in its op."""
    if timeline.comm is None:
        return
    scale, unit = frame.scale, timeline.unit
    out.append('<g class="a2a">')
    for c in comm_cells(timeline):
        y = y0 + c.rank * step + ROW + 1
        hidden = c.end - c.start - c.exposed
        tip = f"<title>{comm_label(c)} {c.start:.6g}..{c.end:.6g} {unit}; exposed {c.exposed:.6g}</title>"
        pale, dark = comm_colours(c)
        if hidden > 0:
            out.append(f'<rect class="hid" x="{frame.x(c.start):.2f}" y="{y:.1f}" width="{hidden * scale:.2f}" '
                       f'height="{LANE}" fill="{pale}">{tip}</rect>')
        if c.exposed > 0:
            out.append(f'<rect class="exp" x="{frame.x(c.end - c.exposed):.2f}" y="{y:.1f}" '
                       f'width="{c.exposed * scale:.2f}" height="{LANE}" fill="{dark}">{tip}</rect>')
    for r, a, b in exposed_spans(timeline):
        out.append(f'<rect class="exposed" x="{frame.x(a):.2f}" y="{y0 + r * step:.1f}" width="{(b - a) * scale:.2f}" '
                   f'height="{ROW}" fill="url(#a2a-hatch)"/>')
    out.append("</g>")


def _dense_rows(out: list[str], timeline: Timeline, frame: Frame, y0: float) -> float:
    """All ranks' rows as one PNG at one pixel per SVG unit (``raster.rank_strips``)."""
    columns = max(1, round(frame.x(frame.span) - frame.x(0)))
    half, blank = ROW // 2, bytes(4 * columns)
    gap = round(pitch(timeline)) - ROW  # a dense picture leaves the all-to-all lane out
    rows: list[bytes] = []
    for strip in raster.rank_strips(timeline, columns=columns, scale=frame.scale):
        rows += [strip.top] * half + [strip.bottom] * (ROW - half) + [blank] * gap
    rows = rows[:-gap] if rows else [blank]
    data = base64.b64encode(raster.png(rows, columns)).decode()
    n = timeline.schedule.num_actions
    out.append(f'<image class="cells dense" x="{frame.x(0):.1f}" y="{y0:.1f}" width="{columns}" '
               f'height="{len(rows)}" preserveAspectRatio="none" href="data:image/png;base64,{data}">'
               f"<title>{n} actions drawn as pixels: each pixel column mixes the colours of the actions in "
               "it; paler = partly idle</title></image>")
    return y0 + timeline.ranks * pitch(timeline)


def _axis(out: list[str], frame: Frame, y: float, unit: str) -> float:
    x0, x1 = frame.x(0), frame.x(frame.span)
    out.append(f'<path class="axis" d="M{x0:.1f} {y:.1f}H{x1:.1f}" stroke="{palette.INK}" stroke-width="0.8"/>')
    for t in ticks(frame.span):
        x = frame.x(t)
        out.append(f'<path d="M{x:.1f} {y:.1f}v4" stroke="{palette.INK}" stroke-width="0.8"/>')
        out.append(f'<text x="{x:.1f}" y="{y + 15:.1f}" text-anchor="middle">{tick_label(t)}</text>')
    out.append(f'<text x="{x1:.1f}" y="{y + 28:.1f}" text-anchor="end" fill="{palette.MUTED}">time ({escape(unit)})</text>')
    return y + 32


def _memory(out: list[str], timeline: Timeline, frame: Frame, y0: float) -> float:
    """Live activations over time: one filled step strip per rank, all on one scale."""
    curves = [memory_envelope(memory_steps(timeline, r), frame.scale) for r in range(timeline.ranks)]
    top = max((lv for c in curves for _, lv in c), default=0.0) or 1.0
    x1 = frame.x(frame.span)
    out.append(f'<text x="{LEFT}" y="{y0 + 10:.1f}" font-weight="bold">live activations per rank '
               f'<tspan font-weight="normal" fill="{palette.MUTED}">(chunk-units; strip height = {top:g})</tspan></text>')
    y = y0 + 16
    for r, curve in enumerate(curves):
        base = y + MEM_ROW
        d = [f"M{frame.x(0):.1f} {base:.1f}"]
        level = 0.0
        for t, level in curve:
            d.append(f"H{frame.x(t):.1f}V{base - level / top * MEM_ROW:.1f}")
        d.append(f"H{x1:.1f}V{base:.1f}Z")
        peak = max((lv for _, lv in curve), default=0.0)
        out.append(f'<text x="{LEFT - 6}" y="{base - 3:.1f}" text-anchor="end" font-size="{FONT - 1}">'
                   f'rank {r}: {peak:g}</text>')
        out.append(f'<path class="mem" d="{"".join(d)}" fill="{palette.MEMORY}" fill-opacity="0.55" '
                   f'stroke="{palette.MEMORY}" stroke-width="0.8"><title>rank {r}: peak {peak:g}</title></path>')
        y = base + 3
    return y


def _table(out: list[str], sums: Sequence[Summary], y: float) -> float:
    comm = any(s.comm for s in sums)
    cols = (("schedule", 0), ("v", 150), ("makespan", 190), ("bubble", 270)) + \
        ((("exposed a2a", 340), ("hidden", 430)) if comm else ()) + (("peak activations / rank", 500 if comm else 340),)
    for head, dx in cols:
        out.append(f'<text x="{LEFT + dx}" y="{y + 12:.1f}" font-weight="bold">{head}</text>')
    for i, s in enumerate(sums):
        yy = y + 12 + 15 * (i + 1)
        a2a = (f"{s.a2a_exposed:.4g}", f"{s.a2a_hidden:.0%}") if comm else ()
        cells_ = (s.name, f"{s.chunks}", f"{s.makespan:.4g}", f"{s.bubble:.1%}", *a2a,
                  " ".join(f"{p:g}" for p in s.peak))
        for (_, dx), text in zip(cols, cells_):
            out.append(f'<text x="{LEFT + dx}" y="{yy:.1f}">{escape(text)}</text>')
    return y + 15 * (len(sums) + 1) + 6


def _legend(out: list[str], sums: Sequence[Summary], y: float, width: float) -> float:
    """Swatches for the kinds drawn, the chunk shades and the F&B pair; wraps to the width."""
    kinds = [k for k in "FBIW" if any(k in s.kinds for s in sums)]
    chunks = max((s.chunks for s in sums), default=1)
    items = [(f'fill="{palette.colour(k)}"', palette.KIND_LABELS[k]) for k in kinds]
    if chunks > 1:
        items += [(f'fill="{palette.colour("F", c, chunks)}"', f"chunk {c}") for c in range(chunks)]
    if any(s.pairs for s in sums):
        items.append((f'fill="none" stroke="{palette.INK}"', "F&B pair: forward over backward"))
    if any(s.comm for s in sums):
        items.append((f'fill="{palette.A2A_HIDDEN}"', "all-to-all lane: hidden behind compute"))
        items.append((f'fill="{palette.A2A}"', "exposed"))
        items.append((f'fill="url(#a2a-hatch)" stroke="{palette.MUTED}"', "exposed all-to-all inside its op"))
    if any(s.transfers for s in sums):
        items.append((f'fill="{palette.COMM_HIDDEN}"', "communication: hidden behind compute"))
        items.append((f'fill="{palette.COMM}"', "exposed"))
    items.append((f'fill="{palette.IDLE}" stroke="{palette.GRID}"', "idle"))
    items.append(("", "numbers: micro-batch"))
    x = LEFT
    for style, label in items:
        room = (18 if style else 0) + len(label) * 6.4 + 16
        if x + room > width - RIGHT and x > LEFT:
            x, y = LEFT, y + 16
        if style:
            out.append(f'<rect class="key" x="{x}" y="{y:.1f}" width="14" height="12" {style}/>')
            x += 18
        out.append(f'<text x="{x}" y="{y + 10:.1f}">{escape(label)}</text>')
        x += len(label) * 6.4 + 16
    return y + 16
