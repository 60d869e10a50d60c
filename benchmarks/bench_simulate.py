"""Schedule core speed: stagewise vs torch.distributed.pipelining, and linear scaling.

Run: .venv/bin/python benchmarks/bench_simulate.py [--repeats 5] [--plot docs/img/simulate_scaling.png]

1. Whole processes, side by side: `stagewise simulate zb-v -p 32 -m 256 --json`
   (generate, validate, simulate, metrics, JSON) vs torch generating the same
   schedule and laying it out on its unit-step grid
   (`_schedule_visualizer.get_schedule_ops(..., add_spacing=True)`). Ratio of medians, of wall time and of the
   child's CPU time (user + system), which the other processes on a shared machine disturb less.
2. `stagewise simulate zb-v -p 64 -m 1024` (393,216 actions) as a whole process: target < 2 s.
3. In-process generate + simulate time for growing m at p=64: time per action must stay flat.
4. Start-up: `stagewise simulate 1f1b -p 2 -m 2` as a whole process against `python -c pass`, CPU time of
   the child (user + system), medians, alternated; the difference is stagewise's start-up (target < 60 ms).
   Run from this checkout's environment, an editable install's import finder is in both.

stagewise's modules are compiled to bytecode first, as pip does when it installs a wheel (and as torch's are in
this environment): with PYTHONDONTWRITEBYTECODE set and no __pycache__, every process would compile all of them
again, which no installed package does (25-30 ms of each stagewise process here).
"""

from __future__ import annotations

import argparse
import compileall
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
PY = sys.executable
STAGEWISE = [PY, "-m", "stagewise"]
TORCH_SNIPPET = (
    "from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops\n"
    "ops = get_schedule_ops('ZBVZeroBubble', {p}, {m}, add_spacing=True)\n"
)


def child(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one whole process (output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def whole(cmd: list[str], repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of a whole process."""
    runs = [child(cmd) for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def startup(repeats: int) -> tuple[float, float]:
    """Median child CPU seconds of a tiny `stagewise simulate` and of a bare interpreter, runs alternated."""
    cmds = (STAGEWISE + ["simulate", "1f1b", "-p", "2", "-m", "2"], [PY, "-c", "pass"])
    spent: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for cmd, out in zip(cmds, spent):
            out.append(child(cmd)[1])
    return statistics.median(spent[0]), statistics.median(spent[1])


def scaling(repeats: int, p: int = 64) -> list[tuple[int, float]]:
    from stagewise.report import result
    from stagewise.costs import Costs
    from stagewise.schedules import generate

    rows = []
    for m in (64, 128, 256, 512, 1024):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            sched = generate("zb-v", p, m)
            result(sched, Costs())
            times.append(time.perf_counter() - t)
        rows.append((sched.num_compute_actions, statistics.median(times)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--plot", default=None, help="write the scaling curve to this PNG")
    args = ap.parse_args()
    compileall.compile_dir(str(HERE / "stagewise"), quiet=1)  # __pycache__, as an install has it (see above)

    n_ours, n_theirs = 3 * args.repeats, max(1, args.repeats // 2)  # ours takes a tenth of a second
    ours = whole(STAGEWISE + ["simulate", "zb-v", "-p", "32", "-m", "256", "--json"], n_ours)
    try:
        theirs = whole([PY, "-c", TORCH_SNIPPET.format(p=32, m=256)], n_theirs)
    except (subprocess.CalledProcessError, FileNotFoundError):
        theirs = (float("nan"), float("nan"))
    print(f"zb-v p=32 m=256 (49,152 actions), whole process, medians of {n_ours} (torch {n_theirs}), wall and CPU:")
    print(f"  torch get_schedule_ops(add_spacing=True): {theirs[0]:7.3f} s wall {theirs[1]:7.3f} s CPU")
    print(f"  stagewise simulate --json:                {ours[0]:7.3f} s wall {ours[1]:7.3f} s CPU   speed-up "
          f"x{theirs[0] / ours[0]:.1f} wall, x{theirs[1] / ours[1]:.1f} CPU")

    big = whole(STAGEWISE + ["simulate", "zb-v", "-p", "64", "-m", "1024", "--json"], args.repeats)
    print(f"zb-v p=64 m=1024 (393,216 actions), whole process: {big[0]:.3f} s wall, {big[1]:.3f} s CPU (target < 2 s)")

    tiny, bare = startup(4 * args.repeats + 1)
    print(f"start-up, child CPU, median of {4 * args.repeats + 1}: stagewise simulate 1f1b -p 2 -m 2 "
          f"{tiny * 1e3:.0f} ms, python -c pass {bare * 1e3:.0f} ms: stagewise's own {(tiny - bare) * 1e3:.0f} ms "
          "(target < 60 ms)")

    rows = scaling(args.repeats)
    print("in-process generate + simulate + metrics, zb-v p=64:")
    for n, t in rows:
        print(f"  {n:>8,} actions  {t:7.3f} s  {t / n * 1e6:6.2f} us/action")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
        ax.plot([n for n, _ in rows], [t for _, t in rows], "o-", color="#0072B2")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:.0f}k")  # 400k, not 400000 run into its neighbour
        ax.set_xlabel("actions (zb-v, p=64, m=64..1024)")
        ax.set_ylabel("seconds")
        ax.set_title("generate + simulate: linear in actions")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
