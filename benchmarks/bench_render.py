"""Rendering large schedules: p = 32 ranks, m = 256 micro-batches.

Run: .venv/bin/python benchmarks/bench_render.py [--repeats 3] [-p 32] [-m 256]

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
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=32)
    ap.add_argument("-m", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-repeats", type=int, default=1, help="the baseline takes 30-50 s a run")
    ap.add_argument("--schedules", default=",".join(WANTED))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.schedules.split(","):
            if name not in FAMILIES:
                continue
            try:
                bench(name, args.p, args.m, args.repeats, args.baseline_repeats, Path(tmp))
            except (ScheduleArgError, ModuleNotFoundError) as e:
                print(f"\n{name}: skipped ({e})")


if __name__ == "__main__":
    main()
