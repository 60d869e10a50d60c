"""The planner's search: at least 1,000 configurations simulated in under 10 s on a 2-core machine.

Profile: data/profiles/gpt-l32-d256-cpu.json (the built-in GPT, 32 blocks,
measured on CPU). Cluster: 96 devices (12 nodes of 8), a slower link between
nodes, 2 GiB per device; global batch 1536; every family, v in {2, 3, 4, 6},
micro-batch sizes 1, 2, 4, 8, 16, recomputation on and off. Every configuration is
simulated (nothing is pruned).

Side by side in one process, alternating, medians of --reps runs: the search
as shipped (schedules and exact partitions cached) against the same search
with the caches emptied before every configuration (the baseline). Reports
configurations, seconds (CPU time of this process and wall), configurations
per second and the ratio. Target: >= 1,000 configurations, < 10 s.

    .venv/bin/python benchmarks/bench_plan_search.py [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from stagewise.plan.search import Cluster
from stagewise.plan.search import Link, Profile
from stagewise.plan.search import Searcher, Space, search

PROFILE = Path(__file__).resolve().parent.parent / "data" / "profiles" / "gpt-l32-d256-cpu.json"


class Uncached(Searcher):
    """The baseline: every configuration generates its schedule and solves its split afresh."""

    def evaluate(self, c):
        self._schedules.clear()
        self._partitions.clear()
        self._schedule(c.family, c.p, c.m, c.v)
        return super().evaluate(c)


def make(cls, prof: Profile) -> Searcher:
    intra = prof.link or Link(latency=1e-5, bandwidth=1e10)
    cl = Cluster(devices=96, per_node=8, memory=2 * 2**30, intra=intra,
                 inter=Link(latency=intra.latency * 4, bandwidth=intra.bandwidth / 8))
    return cls(profile=prof, cluster=cl, global_batch=1536, space=Space(chunks=(2, 3, 4, 6)))


def timed(cls, prof: Profile) -> tuple[int, float, float, object]:
    s = make(cls, prof)
    w, c = time.perf_counter(), time.process_time()
    cands = search(s)
    return len(cands), time.process_time() - c, time.perf_counter() - w, cands[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    prof = Profile.load(PROFILE)
    rows = {"cached": [], "baseline": []}
    for _ in range(args.reps):
        for name, cls in (("cached", Searcher), ("baseline", Uncached)):
            rows[name].append(timed(cls, prof))
    n = rows["cached"][0][0]
    assert n == rows["baseline"][0][0]
    assert rows["cached"][0][3].config == rows["baseline"][0][3].config  # the caches change nothing
    med = {k: (statistics.median(r[1] for r in v), statistics.median(r[2] for r in v)) for k, v in rows.items()}
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {args.reps} runs each, medians")
    print(f"configurations simulated: {n} (target >= 1000)")
    for k, (cpu, wall) in med.items():
        print(f"{k:<9} cpu {cpu:6.2f} s  wall {wall:6.2f} s  {n / cpu:7.0f} configurations/s (cpu)")
    print(f"cached / baseline (cpu): {med['cached'][0] / med['baseline'][0]:.2f}")
    ok = n >= 1000 and med["cached"][0] < 10
    print(f"target met: {'yes' if ok else 'NO'} ({n} configurations in {med['cached'][0]:.2f} s cpu, "
          f"{med['cached'][1]:.2f} s wall)")
    best = rows["cached"][0][3]
    print(f"winner: {best.config.label()}  {best.layout}  step {best.step_time * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
