"""Lowering speed: `lower` + the lowered play against `engine.play` on the same schedule.

Run: .venv/bin/python benchmarks/bench_lowering.py [--repeats 3]

For zb-v and interleaved 1F1B at p=32, m=256 (pp x fsdp 2, every transfer costed): the time of
`simulate` (compute only, engine.play), of `lower`, and of the lowered play (`simulate` with
`Costs.comm`: both), each the median of the repeats, with the lowered programs' length. One engine plays
both (``engine.Engine``); this says what asking for communication costs on top.
"""

from __future__ import annotations

import argparse
import statistics
import time

from stagewise.costs import Costs
from stagewise.lowering import Communication, LoweringOptions, Network, Sizes, lower
from stagewise.lowering.play import simulate_lowered
from stagewise.parallelism import Parallelism
from stagewise.schedules import generate
from stagewise.simulate import simulate


def median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    opts = LoweringOptions(sizes=Sizes(params=1e9, boundary=1e7, tie=1e8),
                           network=Network(intra_bandwidth=4e11, inter_bandwidth=5e10))
    par = Parallelism(pp=32, fsdp=2)
    comm = Communication(parallelism=par, options=opts)
    print(f"{'schedule':<18} {'actions':>8} {'lowered':>8} {'simulate s':>10} {'lower s':>8} {'play s':>7}"
          f" {'both s':>7} {'ratio':>6}")
    for name, v in (("zb-v", None), ("interleaved-1f1b", 2)):
        sched = generate(name, 32, 256, v)
        base = median(lambda: simulate(sched, Costs(bandwidth=1e11, boundary_bytes=1e7)), args.repeats)
        low = lower(sched, par, opts)
        t_lower = median(lambda: lower(sched, par, opts), args.repeats)
        t_all = median(lambda: simulate(sched, Costs(bandwidth=1e11, comm=comm)), args.repeats)
        t_play = median(lambda: simulate_lowered(low, Costs(bandwidth=1e11, comm=comm)), args.repeats)
        n = sum(len(p) for p in low.programs)
        print(f"{name:<18} {sched.num_actions:>8} {n:>8} {base:>10.3f} {t_lower:>8.3f} {t_play:>7.3f} "
              f"{t_all:>7.3f} {t_all / base:>6.1f}")


if __name__ == "__main__":
    main()
