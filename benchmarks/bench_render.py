"""Rendering large schedules: p = 32 ranks, m = 256 micro-batches.

Run: .venv/bin/python benchmarks/bench_render.py [--repeats 3] [-p 32] [-m 256] [--dense-only]

Target (issue 3): the figure of p=32, m=256 renders in under 10 s to a file
under 10 MB. For each family that exists, in one process, medians of the
repeats (the slow baseline: one run unless --baseline-repeats; simulation
excluded, done once beforehand):

- figure: ``draw_figure`` to PNG and to SVG (matplotlib, one PolyCollection);
- baseline, side by side: the naive matplotlib drawing most tools use (one
  ``Rectangle`` patch and one ``text`` per action, as torch's
  ``_schedule_visualizer`` does), same figure size, PNG;
- the pure-Python renderers: ``timeline_svg``, ``chrome_trace`` + JSON, terminal text.

It prints seconds, file sizes, the share of the 10 s / 10 MB budgets and
figure / baseline.

Then pictures at scale (issue 10: zb-v at p=64, m=1024, 393,216 actions;
target under 5 MB and 5 s): the whole `stagewise report` and `stagewise draw`
processes (.html, .svg, .png), wall and CPU seconds and file size, and side
by side in one process the HTML report drawn action by action (the old path,
``raster.DENSE_ACTIONS`` set out of reach) and as pixel columns (the new one).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stagewise.costs import Costs
from stagewise.render import palette
from stagewise.render.ascii import draw_text
from stagewise.render.cells import cells
from stagewise.render.figure import DPI, ROW_IN, WIDTH_IN, draw_figure
from stagewise.render.svg import timeline_svg
from stagewise.render.trace import chrome_trace
from stagewise.schedules import FAMILIES, ScheduleArgError, generate
from stagewise.simulate import simulate

BUDGET_S = 10.0
BUDGET_MB = 10.0
WANTED = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe-v")


def naive_png(timeline, path: Path) -> None:
    """Baseline: one Rectangle patch and one text per action."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig, ax = plt.subplots(figsize=(WIDTH_IN, timeline.ranks * ROW_IN + 1.8))
    chunks = timeline.schedule.chunks
    for c in cells(timeline):
        fill = palette.colour(c.action.kind, c.chunk, chunks)
        ax.add_patch(Rectangle((c.start, c.rank - 0.42), c.end - c.start, 0.84, facecolor=fill,
                               edgecolor="white", linewidth=0.4))
        ax.text((c.start + c.end) / 2, c.rank, str(c.action.mb), ha="center", va="center", fontsize=4)
    ax.set_xlim(0, max(max(e) for e in timeline.ends))
    ax.set_ylim(timeline.ranks - 0.5, -0.5)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def timed(fn, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def bench(name: str, p: int, m: int, repeats: int, baseline_repeats: int, folder: Path) -> None:
    tl = simulate(generate(name, p, m), Costs())
    n = tl.schedule.num_actions
    png, svg, base = folder / f"{name}.png", folder / f"{name}.svg", folder / f"{name}-naive.png"
    t_png = timed(lambda: draw_figure(tl, png), repeats)
    t_base = timed(lambda: naive_png(tl, base), baseline_repeats)
    t_svgfig = timed(lambda: draw_figure(tl, svg), repeats)
    t_svg = timed(lambda: timeline_svg(tl), repeats)
    size_svg = len(timeline_svg(tl).encode())
    t_trace = timed(lambda: json.dumps(chrome_trace(tl), separators=(",", ":")), repeats)
    size_trace = len(json.dumps(chrome_trace(tl), separators=(",", ":")).encode())
    t_text = timed(lambda: draw_text(tl, width=160, color=False), repeats)
    mb = 2**20
    print(f"\n{name}: p={p} m={m}, {n} ops")
    print(f"  figure PNG   {t_png:7.2f} s  {png.stat().st_size / mb:6.2f} MB   "
          f"{t_png / BUDGET_S:5.1%} of 10 s  {png.stat().st_size / mb / BUDGET_MB:5.1%} of 10 MB")
    print(f"  figure SVG   {t_svgfig:7.2f} s  {svg.stat().st_size / mb:6.2f} MB   "
          f"{t_svgfig / BUDGET_S:5.1%} of 10 s  {svg.stat().st_size / mb / BUDGET_MB:5.1%} of 10 MB")
    print(f"  baseline PNG {t_base:7.2f} s  {base.stat().st_size / mb:6.2f} MB   (patch + text per action)")
    print(f"  figure / baseline: {t_png / t_base:.2f}x the time")
    print(f"  timeline_svg {t_svg:7.2f} s  {size_svg / mb:6.2f} MB   chrome trace {t_trace:5.2f} s "
          f"{size_trace / mb:6.2f} MB   text {t_text:5.3f} s")


DENSE = ("zb-v", 64, 1024)
DENSE_COMMANDS = (
    ["report", "--schedules", "zb-v", "-p", "64", "-m", "1024", "-o", "{out}/report.html"],
    ["draw", "zb-v", "-p", "64", "-m", "1024", "--memory", "-o", "{out}/draw.html"],
    ["draw", "zb-v", "-p", "64", "-m", "1024", "--memory", "-o", "{out}/draw.svg"],
    ["draw", "zb-v", "-p", "64", "-m", "1024", "--memory", "-o", "{out}/draw.png"],
)


def cli_run(argv: list[str], repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of a whole `stagewise` process (import, simulate, draw, write)."""
    walls, cpus = [], []
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "stagewise", *argv], check=True, env=env, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def bench_dense(repeats: int, folder: Path) -> None:
    from stagewise.render import raster
    from stagewise.render.html import report_html
    from stagewise.report import result

    name, p, m = DENSE
    print(f"\npictures at scale: {name} p={p} m={m}; target < 5 s and < 5 MB (wall includes the machine's load)")
    for argv in DENSE_COMMANDS:
        argv = [a.format(out=folder) for a in argv]
        wall, cpu = cli_run(argv, repeats)
        size = Path(argv[-1]).stat().st_size / 2**20
        shown = " ".join(argv[:-1]) + " " + Path(argv[-1]).name
        print(f"  stagewise {shown:<66} {wall:6.2f} s wall {cpu:6.2f} s cpu {size:7.2f} MB")
    tl = simulate(generate(name, p, m), Costs())
    entries = [(result(tl.schedule, Costs(), tl), tl)]
    t_new = timed(lambda: report_html(entries, Costs()), repeats)
    size_new = len(report_html(entries, Costs()).encode()) / 2**20
    saved, raster.DENSE_ACTIONS = raster.DENSE_ACTIONS, 10**12  # the old path: one rect per action
    try:
        t_old = timed(lambda: report_html(entries, Costs()), 1)
        size_old = len(report_html(entries, Costs()).encode()) / 2**20
    finally:
        raster.DENSE_ACTIONS = saved
    print(f"  report_html in process: per action {t_old:6.2f} s {size_old:7.1f} MB | pixel columns "
          f"{t_new:6.2f} s {size_new:6.2f} MB: {size_old / size_new:.0f}x smaller, {t_old / t_new:.1f}x faster")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=32)
    ap.add_argument("-m", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-repeats", type=int, default=1, help="the baseline takes 30-50 s a run")
    ap.add_argument("--schedules", default=",".join(WANTED))
    ap.add_argument("--dense-only", action="store_true", help="only the pictures at scale (p=64, m=1024)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench_dense(args.repeats, Path(tmp))
        if args.dense_only:
            return
        for name in args.schedules.split(","):
            if name not in FAMILIES:
                continue
            try:
                bench(name, args.p, args.m, args.repeats, args.baseline_repeats, Path(tmp))
            except (ScheduleArgError, ModuleNotFoundError) as e:
                print(f"\n{name}: skipped ({e})")


if __name__ == "__main__":
    main()
