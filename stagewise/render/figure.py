"""Timeline figures with matplotlib (PNG, SVG or PDF by the path's suffix).

Rows are ranks, x is time to scale; all cells of a picture go into one
PolyCollection, so p=32, m=256 (tens of thousands of cells) draws in about a
second; past thousands of actions narrower than a pixel the rows are one image
of pixel columns (``raster.py``), so zb-v at p=64, m=1024 draws in seconds
to a small file. Micro-batch numbers are shrunk to fit their cell or left out. matplotlib
is imported when a figure is drawn; figures are made without pyplot, so no
display, backend switch or global state is involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..timeline import Timeline
from . import palette, raster
from .cells import (BOTTOM, TOP, Summary, cells, comm_cells, comm_colours, exposed_spans, memory_envelope, memory_steps,
                    summary, unit_label)

WIDTH_IN = 12.0  #: figure width (inches)
DPI = 150
ROW_IN = 0.34  #: height of one rank's row (inches)
FONT = 7.5
MIN_FONT = 5.0  #: smallest micro-batch number worth printing (points)
MAX_LABELS = 4000  #: beyond this many cells' numbers the picture is too dense to read them anyway
RASTER_CELLS = 4000  #: vector outputs (SVG/PDF) rasterize larger cell collections to stay small
MAX_VECTOR_STEPS = 400  #: memory curves with more steps are rasterized in SVG/PDF
SUFFIXES = (".png", ".svg", ".pdf")


def _figure(**kw):
    """A matplotlib Figure outside pyplot: no global state, no backend switch (safe in Jupyter, threads)."""
    from matplotlib.figure import Figure

    return Figure(**kw)


def draw_figure(timeline: Timeline, path, *, memory: bool = False, width: float = WIDTH_IN) -> Path:
    """Draw ``timeline`` to ``path`` (.png/.svg/.pdf); ``memory`` adds the live-activation panel."""
    path = _checked(path)
    sm = summary(timeline)
    ranks = timeline.ranks
    heights = [ranks * ROW_IN + 0.5] + ([ranks * 0.2 + 0.4] if memory else [])
    fig = _figure(figsize=(width, sum(heights) + 1.3))
    axes = fig.subplots(len(heights), 1, sharex=True, gridspec_kw={"height_ratios": heights}, squeeze=False)
    ax = axes[0][0]
    _draw_rows(ax, timeline, sm.makespan, vector=path.suffix != ".png")
    ax.set_title(sm.subtitle, fontsize=8.5, color=palette.MUTED, loc="left")
    _heading(fig, sm.title)
    if memory:
        _draw_memory(axes[1][0], timeline)
    axes[-1][0].set_xlabel(f"time ({sm.unit})", fontsize=8.5)
    _legend(fig, [sm])
    return _save(fig, path)


def compare_figure(timelines: Sequence[Timeline], path, *, width: float = WIDTH_IN) -> Path:
    """Several timelines stacked on one shared time axis, with a table of bubble and peak."""
    if not timelines:
        raise ValueError("compare_figure needs at least one timeline")
    path = _checked(path)
    sums = [summary(tl) for tl in timelines]
    span = max(s.makespan for s in sums)
    heights = [tl.ranks * ROW_IN * 0.8 + 0.35 for tl in timelines] + [0.22 * (len(sums) + 1) + 0.2]
    fig = _figure(figsize=(width, sum(heights) + 1.2))
    axes = fig.subplots(len(heights), 1, gridspec_kw={"height_ratios": heights}, squeeze=False)
    vector = path.suffix != ".png"
    for ax, tl, sm in zip(axes[:-1, 0], timelines, sums):
        _draw_rows(ax, tl, span, vector=vector)
        comm = f"   exposed a2a {sm.a2a_exposed:.4g} ({sm.a2a_hidden:.0%} hidden)" if sm.comm else ""
        ax.set_title(f"{sm.name}   v={sm.chunks}   bubble {sm.bubble:.1%}   peak activations {sm.peak_max:g}{comm}",
                     fontsize=9, loc="left", fontweight="bold")
        ax.tick_params(labelbottom=False)
    axes[-2][0].tick_params(labelbottom=True)
    axes[-2][0].set_xlabel(f"time ({sums[0].unit})", fontsize=8.5)
    _table(axes[-1][0], sums)
    s0 = sums[0]
    _heading(fig, f"p={s0.ranks} m={s0.microbatches}: {len(sums)} schedules on one time axis ({s0.source})")
    _legend(fig, sums)
    return _save(fig, path)


def _heading(fig, text: str) -> None:
    """Bold title in the top 0.3 inch (kept out of tight_layout, which would pad it)."""
    fig.text(0.01, 1 - 0.08 / fig.get_figheight(), text, fontsize=11.5, fontweight="bold", ha="left", va="top")


def _checked(path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"{path}: unknown suffix {path.suffix!r} for a figure; use {', '.join(SUFFIXES)}")
    return path


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def _draw_rows(ax, timeline: Timeline, span: float, *, vector: bool) -> None:
    """One rectangle per action in one collection, numbers where they fit (or pixels, when dense)."""
    columns = int(ax.figure.get_figwidth() * DPI)
    if raster.is_dense(timeline, columns / (span or 1)):
        _draw_dense(ax, timeline, span, columns)
    else:
        _draw_cells(ax, timeline, vector=vector)
        _labels(ax, cells(timeline), timeline.schedule.chunks, span, _row_shape(timeline), timeline.schedule.slices)
    ranks = timeline.ranks
    ax.set_xlim(0, span or 1)
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)], fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color=palette.GRID, linewidth=0.4, alpha=0.6)
    ax.set_axisbelow(True)


#: image rows of one rank in a dense picture: gap, top half, bottom half, gap (0.83 of the row busy;
#: few rows, since matplotlib resamples the image in floats)
_DENSE_ROWS = (1, 5, 5, 1)


def _draw_dense(ax, timeline: Timeline, span: float, columns: int) -> None:
    """The rows as one image of pixel columns (``raster.rank_strips``), to scale on the time axis."""
    import numpy as np

    gap, top, bottom, _ = _DENSE_ROWS
    per = sum(_DENSE_ROWS)
    image = np.zeros((timeline.ranks * per, columns, 4), dtype=np.uint8)
    for r, strip in enumerate(raster.rank_strips(timeline, columns=columns, scale=columns / (span or 1))):
        y = r * per + gap
        image[y:y + top] = np.frombuffer(strip.top, dtype=np.uint8).reshape(columns, 4)
        image[y + top:y + top + bottom] = np.frombuffer(strip.bottom, dtype=np.uint8).reshape(columns, 4)
    ax.imshow(image, extent=(0, span or 1, timeline.ranks - 0.5, -0.5), aspect="auto", interpolation="nearest",
              zorder=2)


#: (top, middle, bottom) of a rank's cells around its row's centre, and its all-to-all lane when there is one
PLAIN_ROW, COMM_ROW, LANE = (-0.42, 0.0, 0.42), (-0.42, -0.08, 0.26), (0.3, 0.46)


def _row_shape(timeline: Timeline) -> tuple[float, float, float]:
    return COMM_ROW if timeline.comm is not None else PLAIN_ROW


def _draw_cells(ax, timeline: Timeline, *, vector: bool) -> None:
    """One rectangle per action in one PolyCollection; F&B pairs outlined; the all-to-all lane."""
    from matplotlib.collections import PolyCollection

    cs = cells(timeline)
    chunks = timeline.schedule.chunks
    hi, mid, lo = _row_shape(timeline)
    verts, fills = [], []
    for c in cs:
        top = c.rank + (hi if c.part != BOTTOM else mid)
        bottom = c.rank + (lo if c.part != TOP else mid)
        verts.append(((c.start, top), (c.end, top), (c.end, bottom), (c.start, bottom)))
        fills.append(palette.colour(c.action.kind, c.chunk, chunks))
    dense = len(cs) > RASTER_CELLS
    coll = PolyCollection(verts, facecolors=fills, edgecolors=palette.IDLE, linewidths=0.0 if dense else 0.4)
    coll.set_rasterized(vector and dense)
    ax.add_collection(coll)
    pairs = [((c.start, c.rank + hi), (c.end, c.rank + hi), (c.end, c.rank + lo), (c.start, c.rank + lo))
             for c in cs if c.part == TOP]
    if pairs and not dense:  # outline each F&B pair so its two halves read as one overlapped cell
        ax.add_collection(PolyCollection(pairs, facecolors="none", edgecolors=palette.INK, linewidths=0.6))
    _draw_comm(ax, timeline, vector=vector, dense=dense)


def _draw_comm(ax, timeline: Timeline, *, vector: bool, dense: bool) -> None:
    """The all-to-all lane under each row (pale where hidden behind compute) and the exposed part hatched."""
    from matplotlib.collections import PolyCollection

    if timeline.comm is None:
        return
    hi, _, lo = _row_shape(timeline)
    a, b = LANE

    def box(r, x0, x1, y0, y1):
        return (x0, r + y0), (x1, r + y0), (x1, r + y1), (x0, r + y1)

    verts, fills = [], []
    for c in comm_cells(timeline):
        cut = c.end - c.exposed
        pale, dark = comm_colours(c)
        if cut > c.start:
            verts.append(box(c.rank, c.start, cut, a, b))
            fills.append(pale)
        if c.exposed > 0:
            verts.append(box(c.rank, cut, c.end, a, b))
            fills.append(dark)
    lane = PolyCollection(verts, facecolors=fills, linewidths=0.0)
    lane.set_rasterized(vector and dense)
    ax.add_collection(lane)
    hatch = PolyCollection([box(r, x0, x1, hi, lo) for r, x0, x1 in exposed_spans(timeline)], facecolors="none",
                           edgecolors=palette.INK, linewidths=0.0, hatch="////")
    hatch.set_rasterized(vector and dense)
    ax.add_collection(hatch)


def _labels(ax, cs, chunks: int, span: float, shape: tuple[float, float, float] = PLAIN_ROW, slices: int = 1) -> None:
    """Micro-batch numbers (micro-batch.slice with slices), shrunk down to MIN_FONT to fit their cell, left out
    below that."""
    fig = ax.figure
    # points per time unit once laid out: the figure less ~0.9 inch of rank labels and margins
    pts_per_unit = (fig.get_figwidth() - 0.9) * 72 / (span or 1)
    placed = []
    for c in cs:
        text = unit_label(c.action.mb, slices)
        top = FONT if c.part == 0 else FONT - 1.5
        size = min(top, ((c.end - c.start) * pts_per_unit - 1.5) / (0.62 * len(text)))
        if size >= MIN_FONT:
            placed.append((c, text, size))
    if len(placed) > MAX_LABELS:
        return
    for c, text, size in placed:
        fill = palette.colour(c.action.kind, c.chunk, chunks)
        hi, mid, lo = shape
        y = c.rank + ((hi + lo) / 2 if c.part == 0 else (hi + mid) / 2 if c.part == TOP else (mid + lo) / 2)
        ax.text((c.start + c.end) / 2, y, text, ha="center", va="center_baseline", fontsize=size,
                color=palette.text_colour(fill))


def _draw_memory(ax, timeline: Timeline) -> None:
    """Live activations per rank: a filled step strip per rank on one scale."""
    curves = [memory_steps(timeline, r) for r in range(timeline.ranks)]
    end = max((t for c in curves for t, _ in c), default=0.0)
    per_unit = ax.figure.get_figwidth() * DPI / (end or 1)
    curves = [memory_envelope(c, per_unit) for c in curves]  # at most a step per pixel
    top = max((lv for c in curves for _, lv in c), default=0.0) or 1.0
    for r, curve in enumerate(curves):
        xs = [t for t, _ in curve] + [end]
        ys = [r + 0.45 - lv / top * 0.85 for _, lv in curve]
        ys.append(ys[-1])
        strip = ax.fill_between(xs, r + 0.45, ys, step="post", color=palette.MEMORY, alpha=0.55, linewidth=0.6)
        strip.set_rasterized(len(xs) > MAX_VECTOR_STEPS)  # SVG/PDF: a dense curve as pixels, not 1000s of nodes
    peaks = [max((lv for _, lv in c), default=0.0) for c in curves]
    ax.set_ylim(timeline.ranks - 0.5, -0.5)
    ax.set_yticks(range(timeline.ranks), [f"rank {r}: {p:g}" for r, p in enumerate(peaks)], fontsize=7)
    ax.tick_params(axis="y", length=0)
    ax.set_title(f"live activations per rank (chunk-units; strip height = {top:g})", fontsize=8.5, loc="left")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _table(ax, sums: Sequence[Summary]) -> None:
    ax.axis("off")
    comm = any(s.comm for s in sums)
    rows = [[s.name, str(s.chunks), f"{s.makespan:.4g}", f"{s.bubble:.1%}",
             *((f"{s.a2a_exposed:.4g}", f"{s.a2a_hidden:.0%}") if comm else ()), f"{s.peak_max:g}",
             " ".join(f"{p:g}" for p in s.peak)] for s in sums]
    labels = ["schedule", "v", "makespan", "bubble", *(("exposed a2a", "hidden") if comm else ()), "peak",
              "peak per rank"]
    widths = [0.16, 0.04, 0.09, 0.08, *((0.09, 0.06) if comm else ()), 0.06, 0.42 if comm else 0.57]
    table = ax.table(cellText=rows, colLabels=labels, loc="upper left", cellLoc="left", colLoc="left",
                     colWidths=widths, edges="")
    for (row, _), cell in table.get_celld().items():
        if row == 0:
            cell.visible_edges = "B"
            cell.get_text().set_fontweight("bold")
    table.auto_set_font_size(False)
    table.set_fontsize(8)


def _legend(fig, sums: Sequence[Summary]) -> None:
    from matplotlib.patches import Patch

    kinds = [k for k in "FBIW" if any(k in s.kinds for s in sums)]
    chunks = max(s.chunks for s in sums)
    handles = [Patch(facecolor=palette.colour(k), label=palette.KIND_LABELS[k]) for k in kinds]
    if chunks > 1:
        handles += [Patch(facecolor=palette.colour("F", c, chunks), label=f"chunk {c}") for c in range(chunks)]
    if any(s.pairs for s in sums):
        handles.append(Patch(facecolor="none", edgecolor=palette.INK, label="F&B pair: F over B in one cell"))
    if any(s.comm for s in sums):
        handles += [Patch(facecolor=palette.A2A_HIDDEN, label="all-to-all: hidden"),
                    Patch(facecolor=palette.A2A, label="exposed"),
                    Patch(facecolor=palette.IDLE, edgecolor=palette.INK, hatch="////", label="exposed, in its op")]
    if any(s.transfers for s in sums):
        handles += [Patch(facecolor=palette.COMM_HIDDEN, label="communication: hidden"),
                    Patch(facecolor=palette.COMM, label="exposed")]
    handles.append(Patch(facecolor=palette.IDLE, edgecolor=palette.GRID, label="idle"))
    rows = -(-len(handles) // 9)
    ncol = -(-len(handles) // rows)
    fig.legend(handles=handles, loc="lower left", ncol=ncol, fontsize=8, frameon=False,
               bbox_to_anchor=(0.01, 0.0), handlelength=1.4, columnspacing=1.2)
    height = fig.get_figheight()
    bottom = 0.32 + 0.2 * (rows - 1)
    fig.tight_layout(rect=(0, bottom / height, 1, 1 - 0.3 / height))  # room for legend and title (inches)
