"""Writing pictures to files, the format chosen by the path's suffix.

``OutputError`` says what is wrong with a path (unknown suffix, a folder that
does not exist, no permission, matplotlib missing) in one line naming the path,
so the CLI can print it and exit 2.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Sequence

from ..costs import Costs
from ..timeline import Timeline
from ..errors import StagewiseError

FIGURE = (".png", ".svg", ".pdf")
TIMELINE_SUFFIXES = FIGURE + (".json", ".html", ".txt")
COMPARE_SUFFIXES = FIGURE + (".html",)


class OutputError(StagewiseError):
    """An output path we cannot write (message names the path and the rule)."""


def has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def check_path(path, allowed: Sequence[str]) -> Path:
    """``path`` as a Path after checking its suffix and that its folder is writable."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in allowed:
        shown = repr(suffix) if suffix else "(none)"
        raise OutputError(f"{path}: unknown suffix {shown}; use one of {', '.join(allowed)}")
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise OutputError(f"{path}: cannot write: {folder} {what}")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise OutputError(f"{path}: cannot write: permission denied")
    if path.is_dir():
        raise OutputError(f"{path}: cannot write: it is a folder")
    if suffix == ".png" or suffix == ".pdf":
        if not has_matplotlib():
            raise OutputError(f"{path}: {suffix} needs matplotlib; pip install 'stagewise[draw]' (or use .svg)")
    return path


def write_timeline(timeline: Timeline, path, *, memory: bool = False, width: int = 120) -> Path:
    """One timeline as a figure, trace (.json), page (.html) or text (.txt)."""
    path = check_path(path, TIMELINE_SUFFIXES)
    suffix = path.suffix.lower()
    try:
        if suffix in FIGURE and has_matplotlib():
            from .figure import draw_figure

            draw_figure(timeline, path, memory=memory)
        elif suffix == ".svg":
            from .svg import timeline_svg

            path.write_text(timeline_svg(timeline, memory=memory), encoding="utf-8")
        elif suffix == ".json":
            from .trace import write_trace

            write_trace(timeline, path)
        elif suffix == ".html":
            _write_report([timeline], path)
        else:
            from .ascii import draw_text

            path.write_text(draw_text(timeline, width=width, color=False) + "\n", encoding="utf-8")
    except OSError as e:
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
    return path


def write_comparison(timelines: Sequence[Timeline], path) -> Path:
    """Several timelines on one time axis as a figure or an HTML page."""
    path = check_path(path, COMPARE_SUFFIXES)
    suffix = path.suffix.lower()
    try:
        if suffix == ".html":
            _write_report(timelines, path)
        elif has_matplotlib():
            from .figure import compare_figure

            compare_figure(timelines, path)
        else:
            from .svg import compare_svg

            path.write_text(compare_svg(timelines), encoding="utf-8")
    except OSError as e:
        raise OutputError(f"{path}: cannot write: {e.strerror or e}") from None
    return path


def _write_report(timelines: Sequence[Timeline], path: Path) -> None:
    from ..report import result
    from .html import report_html

    entries = []
    for tl in timelines:
        costs = tl.meta.get("costs") or Costs()
        entries.append((result(tl.schedule, costs, tl), tl))
    costs = (timelines[0].meta.get("costs") if timelines else None) or Costs()
    path.write_text(report_html(entries, costs), encoding="utf-8")
