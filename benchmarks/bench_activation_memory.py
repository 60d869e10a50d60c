"""Peak activation memory per rank: measured on real ranks against the simulator's prediction.

The built-in GPT (6 blocks, d_model 64, seq 32), p=4, m=8, batch 16, on local
gloo ranks: 1f1b, gpipe, zb-h2, zb-v, v-half and v-min (v=2) in one launch. Each rank counts
the bytes it holds for in-flight micro-batches (autograd's saved tensors, the
stage inputs and outputs, and W's gradients from I to W; once per storage,
weights excluded); the prediction is the simulator's peak for the same
schedule, fed what each (kind, stage) op was measured to add
(stagewise.runtime.execution.activation_memory). Memory is deterministic, so one step
suffices and 4 ranks on 2 cores are fine.

Targets: the order of the schedules by peak memory (the largest rank of each)
is the same measured and predicted, and every rank's measured peak is within
15% of its prediction. Also shown: the worst error of the simulator's former
model, which holds F's bytes unchanged until W (``free_at_i=0``), and, with
``--recompute``, every schedule again with every stage recomputing, and
with ``--overhead``, what counting costs (step time with the meter / without).

    .venv/bin/python benchmarks/bench_activation_memory.py [--recompute] [--overhead] [--layers 6] [--d-model 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

SCHEDULES = ("1f1b", "gpipe", "zb-h2", "zb-v", "v-half", "v-min")
TOLERANCE = 0.15


def kib(x: float) -> str:
    return f"{x / 1024:,.0f}"


def without_i_growth(schedule, added) -> list[float]:
    """The simulator's peaks with nothing held beyond F's bytes (free_at_i = 0)."""
    from stagewise.costs import Costs
    from stagewise.simulate import simulate
    from stagewise.timeline import metrics

    held = [float(added["F"].get(s, 0)) for s in range(schedule.stages)]
    return list(metrics(simulate(schedule, Costs(activation_bytes=held))).peak_activation_bytes)


def table(results, label: str, old_model: bool) -> tuple[float, bool]:
    from stagewise.schedules import generate

    print(f"\n{label}: peak activation KiB per rank, measured / predicted (error)")
    print(f"{'schedule':<9}" + "".join(f"{f'rank {r}':>23}" for r in range(4))
          + ("   with free_at_i=0" if old_model else ""))
    worst = 0.0
    for res in results:
        meas, pred = res.memory.peak_activation_bytes, res.memory.predicted_peak_activation_bytes
        cells = []
        for m, p in zip(meas, pred):
            err = m / p - 1
            worst = max(worst, abs(err))
            cells.append(f"{kib(m)} / {kib(p)} ({err:+.1%})")
        line = f"{res.schedule:<9}" + "".join(f"{c:>23}" for c in cells)
        if old_model:
            sched = generate(res.schedule, res.ranks, res.microbatches)
            old = without_i_growth(sched, res.memory.stage_activation_bytes)
            line += f"   worst {max(abs(m / p - 1) for m, p in zip(meas, old)):.1%}"
        print(line)
    by_meas = sorted(results, key=lambda r: max(r.memory.peak_activation_bytes))
    by_pred = sorted(results, key=lambda r: max(r.memory.predicted_peak_activation_bytes))
    same = [r.schedule for r in by_meas] == [r.schedule for r in by_pred]
    print(f"order by largest rank, measured:  {' < '.join(r.schedule for r in by_meas)}")
    print(f"order by largest rank, predicted: {' < '.join(r.schedule for r in by_pred)}  "
          f"({'same' if same else 'different'})")
    print(f"worst error {worst:.1%}" + (f" (target <= {TOLERANCE:.0%})" if old_model else ""))
    return worst, same


def overhead(d_model: int, seq: int, name: str, reps: int = 15) -> float:
    """Step time with the meter / without, one rank in this process (p=1, m=8), alternating, median ratio."""
    import statistics
    import time

    import torch

    from stagewise.runtime.execution.activation_memory import ActivationMeter
    from stagewise.runtime.execution.program import lower
    from stagewise.runtime.messages.p2p import P2P
    from stagewise.runtime.execution.executor import Executor, RankContext
    from stagewise.runtime.run.models import GPTConfig
    from stagewise.runtime.stages.stage import build_stages, stage_map
    from stagewise.runtime.execution.timing import WallClock
    from stagewise.schedules import generate

    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    model = GPTConfig(layers_n=4, d_model=d_model, heads=4, seq=seq, vocab=64)
    sched = generate(name, 1, 8)
    layers = model.layers().build_all()
    stages = build_stages(sched, stage_map(sched, layers), layers, 0, cpu)
    plan = lower(sched, 0)
    runs = {}
    for metered in (True, False):
        ctx = RankContext(plan=plan, stages=stages, p2p=P2P(plan.messages, 0, cpu, 10),
                          loss=model.loss, clock=WallClock(), meter=ActivationMeter(stages) if metered else None)
        runs[metered] = Executor(ctx)
    xs, ys = model.batch(0, 16)
    mbs = [c.clone() for c in xs.chunk(8)], [c.clone() for c in ys.chunk(8)]
    ratios = []
    for k in range(reps + 2):
        t = {}
        for metered in ((True, False) if k % 2 else (False, True)):
            t0 = time.perf_counter()
            runs[metered].step(*mbs)
            t[metered] = time.perf_counter() - t0
            for st in stages.values():
                st.zero_grad(set_to_none=True)
        if k >= 2:  # warm-up
            ratios.append(t[True] / t[False])
    return statistics.median(ratios)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--recompute", action="store_true", help="also run every schedule with --recompute")
    ap.add_argument("--overhead", action="store_true", help="also time a step with the meter against without")
    args = ap.parse_args()
    from stagewise.runtime import RunConfig
    from stagewise.runtime.run.train import train_many
    from stagewise.runtime.run.models import GPTConfig

    model = GPTConfig(layers_n=args.layers, d_model=args.d_model, heads=4, seq=args.seq, vocab=64)
    base = RunConfig(ranks=4, microbatches=8, batch=16, steps=1, model=model, threads=1)
    cfgs = [dataclasses.replace(base, schedule=name) for name in SCHEDULES]
    if args.recompute:
        cfgs += [dataclasses.replace(c, recompute=True) for c in cfgs]
    results = train_many(cfgs)
    worst, same = table(results[:len(SCHEDULES)], "no recomputation", old_model=True)
    if args.recompute:
        table(results[len(SCHEDULES):], "--recompute, every stage (zb-*: a split stage keeps its replayed forward "
              "from I to W, which the simulator does not model; no target)", old_model=False)
    if args.overhead:
        print("\nthe meter's cost: step time with / without it, one rank in process, p=1 m=8 (median of 15)")
        for d, seq in ((64, 32), (256, 128)):
            for name in ("1f1b", "zb-h1"):
                print(f"  d_model {d:>3} seq {seq:>3} {name:<6} {overhead(d, seq, name):.3f}x")
    ok = same and worst <= TOLERANCE
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
