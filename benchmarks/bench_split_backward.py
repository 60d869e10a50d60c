"""Split backward really splits: time I + W against the full backward B on the built-in GPT.

One process, one thread, the same stage (a middle stage of blocks, and the
first stage with the embedding) and micro-batch; B and I+W are timed in
alternation, several repetitions, medians. Target: (I + W) / B <= 1.2.

    .venv/bin/python benchmarks/bench_split_backward.py [--d-model 256] [--seq 128] [--mb 2] [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from stagewise.runtime.launching.allocator import keep_freed_memory
from stagewise.runtime.run.models import GPTConfig
from stagewise.runtime.execution.split_backward import Splitter, input_grad, weight_grad
from stagewise.runtime.stages.stage import Stage

#: CPU time of this thread: with one torch thread all of F, B, I and W run here, and time other
#: processes take on a shared machine does not count (wall clock: --wall)
CLOCK = time.thread_time


def stage_of(model: GPTConfig, lo: int, hi: int) -> Stage:
    layers = model.layers().build_all()
    return Stage(0, layers[lo:hi], lo)


def stage_input(model: GPTConfig, lo: int, mb: int):
    x, _ = model.batch(0, mb)
    if lo == 0:
        return x
    return torch.randn(mb, model.seq, model.d_model, requires_grad=True)


def time_full(stage: Stage, x, g) -> float:
    out = stage(x)
    t = CLOCK()
    torch.autograd.backward(out, g)
    return CLOCK() - t


def time_split(stage: Stage, splitter: Splitter, x, g) -> tuple[float, float]:
    with splitter.record() as rec:
        out = stage(x)
    t0 = CLOCK()
    input_grad([out], [g], [x] if x.is_floating_point() else [], rec)
    t1 = CLOCK()
    weight_grad(rec)
    return t1 - t0, CLOCK() - t1


def measure(model: GPTConfig, lo: int, hi: int, mb: int, reps: int) -> dict:
    """Medians of B, I, W and of the per-repetition ratio (I+W)/B; B and I+W alternate which goes first."""
    stage = stage_of(model, lo, hi)
    splitter = Splitter(stage, 0)
    x = stage_input(model, lo, mb)
    g = torch.randn(mb, model.seq, model.d_model)
    full, inp, wgt, ratio = [], [], [], []
    for i in range(reps + 2):
        if i % 2:
            a, b = time_split(stage, splitter, x, g)
            f = time_full(stage, x, g)
        else:
            f = time_full(stage, x, g)
            a, b = time_split(stage, splitter, x, g)
        stage.zero_grad(set_to_none=True)
        if i >= 2:  # warm-up
            full.append(f)
            inp.append(a)
            wgt.append(b)
            ratio.append((a + b) / f)
    B, I, W = (statistics.median(v) for v in (full, inp, wgt))
    return {"B": B, "I": I, "W": W, "ratio": statistics.median(ratio),
            "min_ratio": (min(inp) + min(wgt)) / min(full)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--mb", type=int, default=2, help="sequences per micro-batch")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--wall", action="store_true", help="time with the wall clock instead of thread CPU time")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc's heap trimming on (the runtime turns it off on CPU ranks)")
    args = ap.parse_args()
    if args.wall:
        global CLOCK
        CLOCK = time.perf_counter
    torch.set_num_threads(1)
    if not args.default_malloc:
        keep_freed_memory()
    model = GPTConfig(layers_n=4, d_model=args.d_model, heads=4, seq=args.seq, vocab=256)
    clock = "wall" if args.wall else "thread CPU"
    print(f"GPT d_model={args.d_model} seq={args.seq}, micro-batch {args.mb}, 1 thread, {clock} time, medians of "
          f"{args.reps}\n(I+W)/B: median of per-repetition ratios; 'of mins': ratio of the minimum times")
    print(f"{'stage':<28} {'B ms':>8} {'I ms':>8} {'W ms':>8} {'(I+W)/B':>8} {'of mins':>8}")
    worst = 0.0
    for label, lo, hi in (("blocks 1-2 (middle stage)", 1, 3), ("embedding + block 0 (first)", 0, 2)):
        r = measure(model, lo, hi, args.mb, args.reps)
        worst = max(worst, r["ratio"])
        ms = " ".join(f"{r[k] * 1e3:>8.2f}" for k in "BIW")
        print(f"{label:<28} {ms} {r['ratio']:>8.3f} {r['min_ratio']:>8.3f}")
    print(f"worst (I+W)/B = {worst:.3f} (target <= 1.2): {'PASS' if worst <= 1.2 else 'FAIL'}")


if __name__ == "__main__":
    main()
