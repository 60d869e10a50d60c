"""A step of micro-batches of different lengths: measured against the simulator's prediction, side by side.

The step's m micro-batches each hold --rows sequences of one length (a length-bucketing loader), the m lengths
at evenly spaced quantiles of BERT's Wikipedia pre-training set (Krell et al., arXiv:2107.02027; the
histogram in stagewise/data/wikipedia.py) scaled to --seq, at least --seq / 8: lengths 8x apart, in a
shuffled order (``lengths.Distribution``).

Calibration never looks at that step. Uniform steps (every micro-batch of one length, at each of --calibrate)
give each stage's median op time per kind (F, B; I and W for zb-*: the measured timelines'
``timing.mean_costs``, the median over steps). Per stage and kind, a least-squares fit t(L) = c L + q L^2
gives its time at the reference length L0 (the step's mean length), and the attention share
a = sum(q L0^2) / sum(t(L0)) over stages and kinds. The prediction is the simulator on the family's schedule
with those times and the step's per-micro-batch factors ``lengths.apply(costs, lengths, attention_share=a)``;
the length-blind one has every micro-batch alike at L0. A gloo ping-pong at two message sizes gives the link
(latency, bandwidth) for the boundary messages, whose bytes scale with each micro-batch's tokens.

Measured: the step's makespan, first op start to last op end over the ranks (what the simulator predicts;
``step(..., timeline=True)``), and its wall time (barrier to the step's end, the end-of-step gradient sums
included), medians over the steps after warm-up. Every round runs each family's calibration steps and its
variable step in turn (order rotating), so load from other processes falls on calibration and
measurement alike. The built-in GPT, p=2 ranks (one per core), gloo, one thread per rank. Columns: a, the
fitted attention share; measured, predicted and blind (length-blind) makespans; their ratios; the wall time;
busy m/p, the ranks' summed op time measured over predicted (the costs' error, apart from the gaps between ops).

The prediction assumes an op takes as long whether or not the other rank is busy: true with a core per rank,
not when other processes compete for the cores (load above the cores' count). Then an op runs faster while the
other rank waits; uniform steps keep both ranks busier than a variable one does, so they overstate its times
and the prediction overshoots (on this 2-core machine under another process's full core, measured/predicted
fell to about 0.8 for 1f1b). Run it on a quiet machine: its header prints the load average.

    .venv/bin/python benchmarks/bench_varlen.py [--families 1f1b,zb-h1,interleaved-1f1b] [-m 8] [--rounds 6] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

KINDS = ("t_f", "t_b", "t_i", "t_w")  #: the Costs fields a family's measured ops fill (t_b: a full B)


def step_lengths(args) -> tuple[int, ...]:
    """The variable step's m lengths: evenly spaced quantiles of the scaled histogram, floored at seq / 8."""
    from stagewise.data import wikipedia
    from stagewise.lengths import Distribution

    rng, floor = random.Random(args.seed), args.seq // 8
    docs = [max(floor, wikipedia.length(rng, args.seq)) for _ in range(4096)]
    return tuple(x for (x,) in Distribution(tuple(docs), seed=args.seed).microbatches(args.m))


def micro(lengths, rows: int, vocab: int, seed: int):
    """Inputs and targets as lists of micro-batches, ``rows`` sequences each, of the given lengths."""
    import torch

    g = torch.Generator().manual_seed(seed)
    xs = [torch.randint(0, vocab, (rows, n), generator=g) for n in lengths]
    return xs, [torch.roll(x, -1, dims=1) for x in xs]


def link(rank: int, sizes: tuple[int, ...], reps: int) -> list[float]:
    """One-way seconds of a gloo send of each size (float32 elements): the median half round trip."""
    import torch
    import torch.distributed as dist

    out = []
    for n in sizes:
        buf, got = torch.ones(n), []
        for k in range(reps + 2):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if k >= 2:
                got.append((time.perf_counter() - t0) / 2)
        out.append(statistics.median(got))
    return out


def rank_main(args, var) -> dict:
    """One rank: a Pipeline per family, each stepped on uniform and variable steps round after round."""
    import torch.distributed as dist

    import stagewise
    from stagewise.runtime.execution.timing import mean_costs
    from stagewise.runtime.run.models import GPTConfig
    from stagewise.timeline import metrics

    rank = dist.get_rank()
    model = GPTConfig(layers_n=args.layers, d_model=args.d_model, heads=4, seq=args.seq, vocab=64)
    small, large = args.rows * min(args.calibrate) * args.d_model, args.rows * args.seq * args.d_model
    one_way = link(rank, (small, large), 5 if args.tiny else 20)
    pipes = {f: stagewise.Pipeline(f, model.layers(), model.loss, microbatches=args.m, timeout=600)
             for f in args.families}
    cases = [("uniform", n) for n in args.calibrate] + [("variable", None)]
    rec = {(f, c): {"costs": [], "makespan": [], "busy": [], "seconds": []} for f in pipes for c in cases}
    for k in range(args.warmup + args.rounds):
        turn = [(f, c) for f in pipes for c in cases]
        shift = k % len(turn)
        for f, case in turn[shift:] + turn[:shift]:
            lens = var if case[0] == "variable" else (case[1],) * args.m
            xs, ys = micro(lens, args.rows, model.vocab, seed=k)
            res = pipes[f].step(xs, ys, timeline=True)
            for p in pipes[f].parameters():
                p.grad = None
            if rank == 0 and k >= args.warmup:
                r = rec[(f, case)]
                r["costs"].append(mean_costs([res.timeline]))
                got = metrics(res.timeline)
                r["makespan"].append(got.makespan)
                r["busy"].append(sum(got.busy))
                r["seconds"].append(res.seconds)
    out = {"link": one_way, "link_bytes": (4 * small, 4 * large),
           "schedule": {f: p.schedule for f, p in pipes.items()}, **rec}
    return out if rank == 0 else {}


def median_costs(costs) -> dict[str, list[float]]:
    """Per kind, per stage, the median over steps of each step's mean op time."""
    out = {}
    for kind in KINDS:
        rows = [getattr(c, kind) for c in costs]
        out[kind] = [statistics.median(r[s] for r in rows) for s in range(len(rows[0]))]
    return out


def fit(lengths, times) -> tuple[float, float]:
    """Least squares t = c L + q L^2 (no constant: a zero-token micro-batch costs nothing)."""
    s22 = sum(x ** 2 for x in lengths)
    s23 = sum(x ** 3 for x in lengths)
    s44 = sum(x ** 4 for x in lengths)
    b1 = sum(t * x for t, x in zip(times, lengths))
    b2 = sum(t * x * x for t, x in zip(times, lengths))
    det = s22 * s44 - s23 * s23
    return (b1 * s44 - b2 * s23) / det, (s22 * b2 - s23 * b1) / det


def predict(out, family: str, var, args) -> dict:
    """The calibrated prediction for ``family``'s variable step (and the length-blind one)."""
    from stagewise import Costs, lengths, metrics, simulate

    sched = out["schedule"][family]  # the one the pipeline ran
    stages = sched.stages
    per_len = {n: median_costs(out[(family, ("uniform", n))]["costs"]) for n in args.calibrate}
    L0 = sum(var) / len(var)
    at, quad, total = {}, 0.0, 0.0
    run = ("t_f", "t_i", "t_w") if sched.split_backward else ("t_f", "t_b")
    for kind in KINDS:
        at[kind] = []
        for s in range(stages):
            c, q = fit(args.calibrate, [per_len[n][kind][s] for n in args.calibrate])
            at[kind].append(c * L0 + q * L0 * L0)
            if kind in run:  # the kinds the schedule runs: their share of time that grows with L^2
                quad, total = quad + q * L0 * L0, total + at[kind][-1]
    a = min(max(quad / total, 0.0), 0.99)
    (t_small, t_large), (b_small, b_large) = out["link"], out["link_bytes"]
    bandwidth = (b_large - b_small) / max(t_large - t_small, 1e-9)
    latency = max(t_small - b_small / bandwidth, 0.0)
    boundary = 4 * args.rows * L0 * args.d_model
    costs = Costs(t_f=at["t_f"], t_b=at["t_b"], t_i=at["t_i"], t_w=at["t_w"], latency=latency,
                  bandwidth=bandwidth, boundary_bytes=boundary)
    blind = metrics(simulate(sched, costs)).makespan
    aware = metrics(simulate(sched, lengths.apply(costs, var, microbatches=args.m, attention_share=a,
                                                  reference=L0)))
    return {"a": a, "predicted": aware.makespan, "busy": sum(aware.busy), "blind": blind, "latency": latency,
            "bandwidth": bandwidth}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="1f1b,zb-h1,interleaved-1f1b", help="comma-separated schedule families, p=2")
    ap.add_argument("-m", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--rows", type=int, default=4, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=512, help="the longest length (the histogram's 512 scaled to it)")
    ap.add_argument("--calibrate", default=None, help="uniform lengths to calibrate at (default seq/8..seq)")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (+ embedding and head)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2, help="rounds left out of the medians")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a seconds-long run end to end (its figures mean nothing)")
    args = ap.parse_args(argv)
    if args.tiny:
        args.families = "1f1b,zb-h1"
        args.m, args.rows, args.seq, args.layers, args.d_model, args.warmup, args.rounds = 4, 1, 64, 2, 16, 0, 1
        args.calibrate = args.calibrate or "8,64"
    args.families = args.families.split(",")
    n = args.seq
    args.calibrate = (tuple(int(x) for x in args.calibrate.split(",")) if args.calibrate
                      else (n // 8, n // 4, n // 2, n))
    from stagewise import launch

    var = step_lengths(args)
    t, load = time.time(), os.getloadavg()[0]
    out = launch(rank_main, 2, args, var, threads=1, timeout=900)
    print(f"GPT {args.layers} blocks d_model={args.d_model}, p=2, m={args.m} micro-batches of {args.rows} rows; "
          f"gloo, 1 thread per rank; {args.warmup} warm-up + {args.rounds} timed rounds "
          f"({time.time() - t:.0f} s in all; load average {load:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
    print(f"variable step: lengths {list(var)} ({max(var) / min(var):.1f}x apart, mean {sum(var) / len(var):.1f}; "
          f"BERT Wikipedia histogram, Krell et al. 2021, scaled to {args.seq}, floor {args.seq // 8})")
    print(f"calibrated on uniform steps at {list(args.calibrate)} tokens")
    w = max(len(f) for f in args.families)
    head = (f"{'family':<{w}} {'a':>5} {'measured ms':>11} {'predicted':>9} {'meas/pred':>9} {'blind':>7} "
            f"{'meas/blind':>10} {'step wall ms':>12} {'wall/pred':>9} {'busy m/p':>8}")
    print(head)
    print("-" * len(head))
    for f in args.families:
        p = predict(out, f, var, args)
        r = out[(f, ("variable", None))]
        meas, wall = statistics.median(r["makespan"]), statistics.median(r["seconds"])
        print(f"{f:<{w}} {p['a']:>5.2f} {meas * 1e3:>11.1f} {p['predicted'] * 1e3:>9.1f} "
              f"{meas / p['predicted']:>9.3f} {p['blind'] * 1e3:>7.1f} {meas / p['blind']:>10.3f} "
              f"{wall * 1e3:>12.1f} {wall / p['predicted']:>9.3f} {statistics.median(r['busy']) / p['busy']:>8.3f}")
    print(f"link: latency {p['latency'] * 1e6:.0f} us, {p['bandwidth'] / 1e6:.0f} MB/s (gloo ping-pong)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
