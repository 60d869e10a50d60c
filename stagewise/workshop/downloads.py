"""Files of what is on the page: torch CSV, Chrome trace, SVG.

Each is made by the module that owns the format (``torch_csv``,
``render.trace``, ``render.svg``); this only names the file.
"""

from __future__ import annotations

from .. import jsonout, torch_csv
from .api import Settings, SettingError, simulate_settings

FORMATS = {"csv": "text/csv; charset=utf-8", "trace": "application/json", "svg": "image/svg+xml"}


def download(fmt: str, s: Settings) -> tuple[str, str, bytes]:
    """(file name, content type, body) of format ``fmt`` for the settings ``s``."""
    if fmt not in FORMATS:
        raise SettingError(f"format must be one of {', '.join(FORMATS)}; got {fmt!r}", "format")
    timelines = [tl for tl, _ in simulate_settings(s)]
    stem = "-".join(s.schedules) + f"-p{s.p}-m{s.m}" + (f"-v{s.v}" if s.v else "")
    if fmt == "csv":
        if len(timelines) != 1:
            raise SettingError("the torch CSV holds one schedule; choose one", "schedules")
        body = torch_csv.dumps(timelines[0].schedule)
    elif fmt == "trace":
        body = _trace(timelines)
    else:
        body = _svg(timelines)
    ext = "json" if fmt == "trace" else fmt
    return f"{stem}.{ext}", FORMATS[fmt], body.encode()


def _trace(timelines) -> str:
    from ..render.trace import chrome_trace

    if len(timelines) != 1:
        raise SettingError("a Chrome trace holds one timeline; choose one schedule", "schedules")
    trace = chrome_trace(timelines[0])
    return trace if isinstance(trace, str) else jsonout.dumps(trace)


def _svg(timelines) -> str:
    from ..render import svg

    if len(timelines) == 1:
        tl = timelines[0]
        return svg.timeline_svg(tl, memory=True, title=_title(tl))
    return svg.compare_svg(timelines)


def _title(tl) -> str:
    sc = tl.schedule
    return f"{sc.name}  p={sc.ranks} m={sc.microbatches} v={sc.chunks}"
