"""Picture subcommands: `draw` (one timeline to a file or the terminal) and `report` (HTML)."""

from __future__ import annotations

from pathlib import Path

from .. import limits
from ..report import table
from .common import (UsageError, add_cost_args, add_schedule_args, add_shape_args, check_timeline_output, costs_from,
                     positive_int, read_checked, schedule_from)
from .memory import add_memory_action_args, placed




def register(sub) -> None:
    p = sub.add_parser("draw", help="draw a schedule's timeline: PNG/SVG/PDF figure, Chrome trace, HTML or text",
                       description="Simulate a schedule (NAME or --csv FILE) and draw its timeline. The format "
                       "follows the suffix of -o: .png .svg .pdf (figure), .json (Chrome/Perfetto trace), "
                       ".html (self-contained page), .txt (text); without -o, draw in the terminal.")
    add_schedule_args(p)
    add_cost_args(p)
    add_memory_action_args(p)
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="output file; format by suffix (.png .svg .pdf .json .html .txt)")
    p.add_argument("--memory", action="store_true", help="add a panel of live activations per rank over time")
    p.add_argument("--width", type=positive_int, default=None, help="text width in columns (default: the terminal's)")
    p.set_defaults(func=cmd_draw)

    p = sub.add_parser("report", help="write one self-contained HTML page comparing all schedule families",
                       description="Simulate every family that accepts p and m (or --schedules) and write an "
                       "offline HTML page: figures, the table of bubble (simulated and closed form), makespan, "
                       "peak memory per rank, and the cost assumptions.")
    add_shape_args(p, chunks="chunks for the families that take v")
    p.add_argument("--schedules", default=None, help="comma-separated families (default: all that accept p, m)")
    add_cost_args(p)
    p.add_argument("-o", "--output", metavar="DIR", default=".",
                   help="folder for report.html (default: the current folder), or a path ending in .html")
    p.set_defaults(func=cmd_report)


def cmd_draw(args) -> int:
    from ..render.output import OutputError, write_timeline
    from ..simulate import simulate

    if args.width is not None:
        if args.width < 20:
            raise UsageError(f"--width must be at least 20 columns; got {args.width}")
        limits.TEXT_WIDTH.check(args.width, "--width")
    if args.output:
        check_timeline_output("-o", args.output)  # before simulating: a big schedule takes a while
    schedule = schedule_from(args)
    costs = costs_from(args, schedule)
    with_memory = placed(args, schedule, costs)
    timeline = simulate(with_memory, costs, check=not read_checked(args) or with_memory is not schedule)
    if not args.output:
        from ..render.ascii import draw_text

        print(draw_text(timeline, width=args.width))
        return 0
    try:
        path = write_timeline(timeline, args.output, memory=args.memory, width=args.width or 120)
    except OutputError as e:
        raise UsageError(f"-o {e}") from None
    print(f"wrote {path}")
    return 0


def report_path(output: str) -> Path:
    """-o DIR -> DIR/report.html (created); -o FILE.html -> FILE.html."""
    path = Path(output)
    if path.suffix.lower() == ".html":
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o {path}: cannot create the folder: {e.strerror}") from None
    return path / "report.html"


def cmd_report(args) -> int:
    from ..render.output import OutputError, check_path
    from ..render.html import report_html
    from .core import compare_entries

    path = report_path(args.output)
    try:
        check_path(path, (".html",))
        entries = compare_entries(args)
        path.write_text(report_html(entries, costs_from(args), costs_per=args.costs_per), encoding="utf-8")
    except OutputError as e:
        raise UsageError(f"-o {e}") from None
    except OSError as e:
        raise UsageError(f"-o {path}: cannot write: {e.strerror}") from None
    print(table([r for r, _ in entries]))
    print(f"\nwrote {path}")
    return 0


__all__ = ["register", "cmd_draw", "cmd_report"]
