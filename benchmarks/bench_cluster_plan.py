"""The cluster planner's search time for the shipped models at any GPU count up to 16,384 (target: < 10 s).

Each case is `stagewise plan --model M --hardware h100 --gpus N --global-batch-tokens T`'s
search (every framework, every family, t x p x dp, v, micro-batch size, recomputation,
sharding), timed in CPU seconds of this process and wall seconds, with how many
configurations it enumerated, simulated and pruned before building their schedule.
Side by side, for the cases named by --baseline, the same search with every
configuration's schedule built and prepared before any is simulated (no schedule-free
bound: the search as it was), with the ratio; and for a few cases the plan's steps (each configuration's
lowered program played, for those that can still reach the top) against the O(stages) traffic rules' steps
(`cluster_search(lowered=False)`): time ratio, whether the winner is the same, how far the top 10's steps
move. Medians of --reps runs.

    PYTHONPATH=$PWD python benchmarks/bench_cluster_plan.py [--quick] [--reps 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from stagewise.plan.cluster import Job, cluster_search
from stagewise.plan.errors import PlanError
from stagewise.plan.cluster import Hardware
from stagewise.plan.cluster import TransformerSpec

#: (model, tokens per step): the papers' batches
MODELS = [("llama3-8b", 4 * 2**20), ("llama3-70b", 8 * 2**20), ("llama3-405b", 16 * 2**20),
          ("gpt3-175b", 1536 * 2048), ("gpt-1t", 3072 * 2048), ("mcore-462b", 3072 * 4096)]
GPUS = [64, 512, 1000, 2048, 4096, 6144, 8192, 12288, 16384]
QUICK = [("llama3-8b", 64), ("llama3-70b", 2048), ("llama3-405b", 4096), ("llama3-405b", 16384)]
BASELINE = [("llama3-405b", 4096), ("llama3-405b", 16384)]
LOWERED = [("llama3-8b", 64), ("llama3-405b", 16384), ("gpt3-175b", 12288), ("gpt-1t", 1000)]


def timed(job: Job, reps: int, floors: bool = True, lowered: bool = True) -> tuple[float, float, object]:
    """(median CPU s, median wall s, the last result) of the search."""
    cpu, wall, res = [], [], None
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        res = cluster_search(job, floors=floors, lowered=lowered)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall), res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} cases")
    ap.add_argument("--reps", type=int, default=1, help="runs per case (median), default 1")
    args = ap.parse_args()
    hw = Hardware.load("h100")
    tokens = dict(MODELS)
    cases = QUICK if args.quick else [(m, g) for m, _ in MODELS for g in GPUS]
    head = (f"{'model':<13}{'GPUs':>6}{'CPU s':>8}{'wall s':>8}{'configs':>9}{'simulated':>10}{'lowered':>8}"
            f"{'unbuilt':>9}{'too big':>9}  winner")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n{head}\n{'-' * len(head)}")
    worst = (0.0, None)
    for model, gpus in cases:
        job = Job(spec=TransformerSpec.load(model), hardware=hw, gpus=gpus, global_batch_tokens=tokens[model])
        try:
            cpu, wall, res = timed(job, args.reps)
        except PlanError as e:
            print(f"{model:<13}{gpus:>6}  no plan: {str(e)[:90]}")
            continue
        worst = max(worst, (cpu, (model, gpus)))
        top = res.ranking[0] if res.ranking else None
        what = f"{top.config.family} t={top.parallelism.tp} p={top.config.p} {top.mfu:.1%} MFU" if top else "nothing fits"
        print(f"{model:<13}{gpus:>6}{cpu:>8.2f}{wall:>8.2f}{res.configurations:>9}{res.simulated:>10}"
              f"{res.lowered:>8}{res.unbuilt:>9}{res.too_big:>9}  {what}")
    print(f"\nslowest: {worst[1][0]} on {worst[1][1]} GPUs, {worst[0]:.2f} CPU s (target < 10 s)")
    for model, gpus in BASELINE:
        job = Job(spec=TransformerSpec.load(model), hardware=hw, gpus=gpus, global_batch_tokens=tokens[model])
        cpu, wall, res = timed(job, args.reps)
        cpu0, wall0, res0 = timed(job, args.reps, floors=False)
        same = [c.step_time for c in res.ranking[:10]] == [c.step_time for c in res0.ranking[:10]]
        print(f"{model} on {gpus}: {cpu:.2f} CPU s with the schedule-free bound ({res.unbuilt} not built), "
              f"{cpu0:.2f} without (everything built): {cpu0 / cpu:.2f}x; same top 10: {'yes' if same else 'NO'}")
    print("\nsteps from the lowered programs (the plan's) against the O(stages) traffic rules' (lowered=False):")
    for model, gpus in LOWERED:
        job = Job(spec=TransformerSpec.load(model), hardware=hw, gpus=gpus, global_batch_tokens=tokens[model])
        cpu, _, res = timed(job, args.reps)
        cpu0, _, res0 = timed(job, args.reps, lowered=False)
        rules = {c.label(): c.step_time for c in res0.ranking}
        diff = [abs(c.step_time / rules[c.label()] - 1) for c in res.ranking[:10] if c.label() in rules]
        same = res.ranking[0].label() == res0.ranking[0].label()
        print(f"{model} on {gpus}: {cpu:.2f} CPU s ({res.lowered} lowered) vs {cpu0:.2f}: x{cpu / cpu0:.2f}; "
              f"same winner: {'yes' if same else 'NO'}; top 10's steps differ by at most {max(diff, default=0):.2%}")


if __name__ == "__main__":
    main()
