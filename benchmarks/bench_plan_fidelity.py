"""Planner fidelity: predicted vs measured step time and peak activations of the top configurations.

Profiles the built-in GPT (4 blocks, d_model 256, seq 128, one torch thread,
micro-batch sizes 1, 2, 4, and the gloo link between two local ranks), plans
for N devices and a global batch of 16 with recomputation off, then runs the
top 3 configurations that fit on N local gloo ranks, in
alternating rounds (so load from elsewhere falls on all alike). Measured step
time is the median over the steps after each round's first.

Acceptance (issue 6): predicted within 10% of measured for the top 3, and the
configuration measured fastest among the planner's top 2. The profile includes
the per-step work outside the layers and the layers' slowdown inside a run (issue 14:
`stagewise profile` measures both on 2 local ranks); --no-overhead predicts from the layers alone. This machine has 2
cores: N=2 is the honest check; N=4 oversubscribes (4 single-thread ranks on
2 cores) and is reported for what it is.

    .venv/bin/python benchmarks/bench_plan_fidelity.py [--devices 2] [--rounds 3] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from stagewise.plan.search import Cluster
from stagewise.profiling.link import measure_link
from stagewise.profiling.measure import profile_model
from stagewise.plan.search import KEY
from stagewise.profiling.step_overhead import measure_overhead
from stagewise.plan.search import Searcher, Space, search
from stagewise.profiling.verify import verify, verify_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-overhead", action="store_true", help="predict from the layers alone (as before)")
    args = ap.parse_args()
    from stagewise.runtime.run.models import GPTConfig

    load0 = os.getloadavg()[0]
    gpt = GPTConfig(layers_n=args.layers, d_model=256, heads=8, seq=128, vocab=256)
    prof = profile_model(gpt, (1, 2, 4), repeats=7, threads=1)
    prof = replace(prof, link=measure_link())
    if not args.no_overhead:  # what `stagewise profile` measures: work outside the layers
        prof = replace(prof, meta={**prof.meta, KEY: measure_overhead(prof, log=print)})
        fit = prof.meta[KEY]
        print(f"per step outside the layers: {fit['fixed_s'] * 1e3:.1f} ms + {fit['per_action_s'] * 1e3:.2f} ms "
              f"per action of the busiest rank; layers {fit['slowdown']:+.1%} slower in a run than alone")
    print(f"profile: {prof.model} {args.layers} blocks on {prof.device}; link {prof.link.latency * 1e6:.0f} us + "
          f"bytes / {prof.link.bandwidth / 1e9:.3g} GB/s")
    cl = Cluster(devices=args.devices, per_node=args.devices, memory=None, intra=prof.link, inter=prof.link)
    cands = search(Searcher(profile=prof, cluster=cl, global_batch=16, space=Space(recompute=(False,))))
    rows = verify(prof, cands, 3, steps=args.steps, rounds=args.rounds, log=print)
    print(verify_table(rows))
    errors = [abs(r["error"]) for r in rows]
    for n, (r, c) in enumerate(zip(rows, cands), 1):
        alone = (r["predicted_step"] - c.overhead) / r["measured_step"] - 1
        print(f"#{n}: layers alone {alone:+.1%}, with the measured overhead {r['error']:+.1%}")
    fastest = min(range(len(rows)), key=lambda i: rows[i]["measured_step"])
    print(f"load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores")
    print(f"max |error| of the top 3: {max(errors):.1%} (target <= 10%): {'yes' if max(errors) <= 0.10 else 'NO'}")
    print(f"measured fastest is the planner's #{fastest + 1} (target: #1 or #2): {'yes' if fastest < 2 else 'NO'}")


if __name__ == "__main__":
    main()
