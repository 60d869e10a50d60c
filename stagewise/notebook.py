"""Jupyter display: timelines, schedules and comparisons draw themselves.

``Timeline`` and ``Schedule`` have tiny ``_repr_html_``/``_repr_svg_`` methods that ask
``stagewise.display``; this module registers the drawing there (its last lines), and is loaded on the
first display only, so the core stays light and never imports its view.
The look is the workshop page's: the same summary row (makespan, simulated
bubble next to the closed form, peak activations per rank) over the timeline
drawn by ``stagewise.render.svg`` in the shared palette, memory strips included.
Pure Python: no IPython, matplotlib or torch needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Sequence

from . import display
from .costs import Costs
from .formulas import bubble_fraction
from .render import palette
from .render.svg import compare_svg, timeline_svg
from .schedule import Schedule
from .simulate import simulate
from .timeline import Timeline, metrics
from .validate import ScheduleError

WIDTH = 900  #: px, wide enough for m=64 labels, narrow enough for a notebook cell
#: the workshop's table style, scoped to the output
CSS = ("<style>.stagewise-nb table{border-collapse:collapse;font:13px system-ui,sans-serif;margin:4px 0 6px}"
       f".stagewise-nb th{{text-align:left;color:{palette.TABLE_TEXT};font-weight:600;font-size:12px;"
       f"padding:2px 12px 2px 0;border-bottom:1px solid {palette.TABLE_RULE}}}"
       f".stagewise-nb td{{padding:2px 12px 2px 0;border-bottom:1px solid {palette.TABLE_RULE_LIGHT}}}"
       ".stagewise-nb td.bubble{font-weight:600}"
       f".stagewise-nb p{{font:12px system-ui,sans-serif;color:{palette.TABLE_TEXT};margin:2px 0}}"
       ".stagewise-nb svg{max-width:100%;height:auto}</style>")
HEAD = ("schedule", "p", "m", "v", "makespan", "bubble", "closed form", "peak activations per rank")


def _pct(x: float | None) -> str:
    return "\u2014" if x is None else f"{x:.1%}"


def closed_form(tl: Timeline) -> float | None:
    """The literature's bubble for a simulated timeline's costs (None when measured or none exists)."""
    costs = tl.meta.get("costs")
    if tl.source != "simulated" or not isinstance(costs, Costs):
        return None
    sc = tl.schedule
    return bubble_fraction(sc.name, sc.ranks, sc.microbatches // sc.slices, sc.chunks, costs, sc.slices)


def summary_row(tl: Timeline) -> str:
    sc, mt = tl.schedule, metrics(tl)
    cells = (escape(sc.name), sc.ranks, sc.microbatches, sc.chunks, f"{mt.makespan:.4g}")
    peaks = " ".join(f"{x:g}" for x in mt.peak_activations)
    return ("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + f'<td class="bubble">{_pct(mt.bubble_fraction)}</td>'
            f"<td>{_pct(closed_form(tl))}</td><td>{peaks}</td></tr>")


def table(timelines: Sequence[Timeline]) -> str:
    head = "".join(f"<th>{h}</th>" for h in HEAD)
    return f"<table><tr>{head}</tr>{''.join(summary_row(tl) for tl in timelines)}</table>"


def timeline_html(tl: Timeline) -> str:
    """A timeline's summary row over its picture with memory strips."""
    svg = timeline_svg(tl, width=WIDTH, memory=True, standalone=False)
    return f'<div class="stagewise-nb">{CSS}{table([tl])}{svg}</div>'


def timeline_image(tl: Timeline) -> str:
    return timeline_svg(tl, width=WIDTH, memory=True)


def schedule_timeline(schedule: Schedule) -> Timeline:
    """A schedule shows itself simulated at the seed costs (t_F = 1, t_B = 2)."""
    return simulate(schedule, Costs())


def schedule_html(schedule: Schedule) -> str:
    try:
        tl = schedule_timeline(schedule)
    except ScheduleError as e:  # a display must not raise: show why it cannot be drawn
        why = f"{escape(schedule.name)}: invalid schedule: {escape(str(e))}"
        return f'<div class="stagewise-nb">{CSS}<p>{why}</p></div>'
    note = "<p>simulated with t_F = 1, t_B = 2 (pass a Costs to stagewise.simulate for others)</p>"
    return timeline_html(tl).replace("</table>", f"</table>{note}", 1)


def schedule_image(schedule: Schedule) -> str | None:
    try:
        return timeline_image(schedule_timeline(schedule))
    except ScheduleError:
        return None  # Jupyter then falls back to the text form


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Several timelines on one time axis (same p, m and costs, different schedules)."""

    timelines: tuple[Timeline, ...]

    def _repr_html_(self) -> str:
        svg = compare_svg(self.timelines, width=WIDTH, standalone=False)
        return f'<div class="stagewise-nb">{CSS}{table(self.timelines)}{svg}</div>'

    def _repr_svg_(self) -> str:
        return compare_svg(self.timelines, width=WIDTH)

    def __iter__(self):
        return iter(self.timelines)


def compare(names: Sequence[str], ranks: int, microbatches: int, chunks: int | None = None,
            costs: Costs | None = None) -> Comparison:
    """Simulate each named family at the same p, m (and v where the family takes it) and costs."""
    from .compare import compare as compare_families

    entries = compare_families(names, ranks, microbatches, chunks, costs)
    return Comparison(timelines=tuple(e.timeline for e in entries))


display.register(Timeline, html=timeline_html, svg=timeline_image)
display.register(Schedule, html=schedule_html, svg=schedule_image)
