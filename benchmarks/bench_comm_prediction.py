"""Measured against predicted step time for pp x dp and pp x FSDP on the built-in GPT (gloo, local ranks).

For each layout (pp2 x dp2, pp2 x fsdp2) and schedule: train a few steps (``RunConfig``, 4 ranks), take the
median step after the first; from rank 0's measured timeline take the mean F and B time (every stage is
given rank 0's: the run records rank 0's timeline only); on 2 ranks of gloo, time the collectives the
lowering uses on one stage's parameters (all-gather and reduce-scatter for FSDP, all-reduce for dp), the tied
embedding's all-reduce and one activation's send; turn them into the network's bandwidth and the link's
latency; then simulate the lowered schedule (``Costs.comm``) and the compute-only one. Printed: the measured
step (median after the first: program, collectives, optimizer), rank 0's measured program span (first op to
last), the predictions without and with communication, and each measured time over the prediction with
communication. The optimizer step is in the measured step and in no prediction.

    .venv/bin/python benchmarks/bench_comm_prediction.py [--steps 6] [--d-model 256] [--schedules 1f1b,zb-h1]
"""

from __future__ import annotations

import argparse
import statistics
import time


def collectives(stage_bytes: float, tie_bytes: float, act_bytes: float, repeats: int = 5) -> dict:
    """On 2 gloo ranks: median seconds of each collective the lowering prices, rank 0's view."""
    import warnings

    import torch
    import torch.distributed as dist

    from stagewise.profiling.link import ping_pong

    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13 renames the *_tensor collectives
    out = {}
    n = max(1, int(stage_bytes // 4))
    whole, half = torch.zeros(2 * (n // 2)), torch.zeros(n // 2)

    def timed(fn) -> float:
        times = []
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    out["all-gather"] = timed(lambda: dist.all_gather_into_tensor(whole, half))
    out["reduce-scatter"] = timed(lambda: dist.reduce_scatter_tensor(half, whole))
    out["all-reduce"] = timed(lambda: dist.all_reduce(whole))
    tie = torch.zeros(max(1, int(tie_bytes // 4)))
    out["tie all-reduce"] = timed(lambda: dist.all_reduce(tie))
    # one activation's one-way time: the link profiler's own ping-pong (warm-up, median)
    out["send"] = ping_pong([int(act_bytes)], repeats)[0][1]
    return out


def stage_bytes(model, stages: int) -> list[float]:
    from stagewise.runtime.stages.stage import partition

    layers = model.layers()
    sizes = [sum(p.numel() * 4 for p in layers.build(i).parameters()) for i in range(layers.count)]
    return [float(sum(sizes[i] for i in r)) for r in partition(layers.count, stages)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--schedules", default="1f1b,zb-h1")
    args = ap.parse_args()

    from stagewise.costs import Costs
    from stagewise.lowering import Communication, LoweringOptions, Network, Sizes
    from stagewise.parallelism import Parallelism
    from stagewise.runtime import RunConfig, train
    from stagewise.runtime.launching.local import launch
    from stagewise.runtime.run.models import GPTConfig
    from stagewise.schedules import generate
    from stagewise.simulate import simulate

    model = GPTConfig(layers_n=args.layers, d_model=args.d_model, heads=4, seq=args.seq, vocab=256)
    batch = 8
    per_stage = stage_bytes(model, 2)
    tie = model.vocab * model.d_model * 4.0
    act = batch / 2 / args.m * args.seq * args.d_model * 4.0  # one micro-batch of one data shard
    got = launch(collectives, 2, max(per_stage), tie, act)
    print(f"gloo, 2 ranks: stage parameters {max(per_stage) / 1e6:.2f} MB; " +
          ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in got.items()))
    B = max(per_stage)
    print(f"{'layout':<14} {'schedule':<8} {'step s':>8} {'program s':>9} {'compute s':>9} {'with comm s':>11} "
          f"{'step/pred':>9} {'program/pred':>12}")
    for layout in ({"dp": 2}, {"fsdp": 2}):
        # the ring time of each collective on 2 ranks, inverted: all-gather and reduce-scatter move B/2,
        # all-reduce 2 x B/2
        if "fsdp" in layout:
            bw = (B / 2) / ((got["all-gather"] + got["reduce-scatter"]) / 2)
        else:
            bw = B / got["all-reduce"]
        net = Network(intra_bandwidth=bw, inter_bandwidth=bw)
        for name in args.schedules.split(","):
            res = train(RunConfig(schedule=name, ranks=2, microbatches=args.m, steps=args.steps, batch=batch,
                                  model=model, measure_memory=False, **layout))
            measured = statistics.median(res.step_time_s[1:])
            tl = res.last_timeline
            f = [e - s for op, s, e in tl.rows(0) if getattr(op, "kind", "") == "F"]
            b = [e - s for op, s, e in tl.rows(0) if getattr(op, "kind", "") in ("B", "I", "W")]
            sched = generate(name, 2, args.m)
            base = Costs(t_f=statistics.mean(f), t_b=statistics.mean(b) * (2 if sched.split_backward else 1),
                         latency=got["send"])
            comm = Communication(parallelism=Parallelism(**layout), options=LoweringOptions(
                sizes=Sizes(params=per_stage, tie=tie), network=net, step_end=False))
            from dataclasses import replace

            alone = simulate(sched, base)
            lowered = simulate(sched, replace(base, comm=comm))
            p0 = alone.finish - alone.origin
            p1 = lowered.finish - lowered.origin
            label = " x ".join(f"{k}{v}" for k, v in {"pp": 2, **layout}.items())
            span = tl.finish - tl.origin  # rank 0's program, first op to last (no optimizer step)
            print(f"{label:<14} {name:<8} {measured:>8.4f} {span:>9.4f} {p0:>9.4f} {p1:>11.4f} {measured / p1:>9.2f} "
                  f"{span / p1:>12.2f}")


if __name__ == "__main__":
    main()
