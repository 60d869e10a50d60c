"""Published rows vs the analytic planner: Megatron-LM SC21 Table 1 and Llama 3 Table 4.

For each published configuration (model, GPUs, tensor x pipeline, global batch)
the planner predicts the step time of that layout (the best micro-batch size, v
and split it finds for the published t, p and schedule family) and converts it
to the paper's own per-GPU figure; then it is asked freely (same GPUs, same
batch, every t x p x family x v x micro-batch size x recomputation) and the rank
of the published t x p in its ranking is reported.

Sources (numbers copied from the papers):
- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC21, arXiv:2104.04473, Table 1: GPT models, vocabulary
  51,200, sequence 2,048, A100 80GB on Selene, activation recomputation on; the
  per-GPU teraFLOP/s counts the recomputation: F = 96 B s l h^2 (1 + s/6h + V/16lh)
  (their eq. 3). Megatron's 2021 code had neither sequence parallelism nor a
  sharded optimizer.
- Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 4: 405B on
  H100s, TP 8, CP 1, PP 16, DP 64 and 128, sequence 8,192, 16M tokens per batch,
  430 and 400 TFLOPs/GPU (43% and 41% BF16 MFU). The long-context row (CP 16) is
  left out: context parallelism is not modelled.

Efficiency factors: one per GPU type, calibrated on one row each (``--calibrate``
prints the value that reproduces the calibration row; the shipped hardware files
hold it).

    PYTHONPATH=$PWD python benchmarks/bench_published.py [--calibrate] [--quick]
    PYTHONPATH=$PWD python benchmarks/bench_published.py --layouts gpt-18b [--free-collectives]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import NamedTuple

from stagewise.plan.analytic import RECOMPUTE
from stagewise.plan.cluster_search import Job, cluster_search
from stagewise.plan.hardware import Hardware
from stagewise.plan.profile import Link
from stagewise.plan.search import Space
from stagewise.plan.transformer import TransformerSpec


class Row(NamedTuple):
    paper: str
    model: str
    hardware: str
    gpus: int
    t: int
    p: int
    batch: int  #: sequences per step
    published: float  #: TFLOP/s per GPU as the paper counts it
    metric: str  #: "megatron" (eq. 3, with recomputation) or "model" (MFU's FLOPs)
    calibration: bool = False


MEGATRON = "Megatron-LM SC21 Table 1"
LLAMA = "Llama 3 Table 4"
ROWS = [
    Row(MEGATRON, "gpt-1.7b", "a100", 32, 1, 1, 512, 137, "megatron"),
    Row(MEGATRON, "gpt-3.6b", "a100", 64, 2, 1, 512, 138, "megatron"),
    Row(MEGATRON, "gpt-7.5b", "a100", 128, 4, 1, 512, 142, "megatron"),
    Row(MEGATRON, "gpt-18b", "a100", 256, 8, 1, 1024, 135, "megatron"),
    Row(MEGATRON, "gpt-39b", "a100", 512, 8, 2, 1536, 138, "megatron"),
    Row(MEGATRON, "gpt-76b", "a100", 1024, 8, 4, 1792, 140, "megatron"),
    Row(MEGATRON, "gpt-145b", "a100", 1536, 8, 8, 2304, 148, "megatron", calibration=True),
    Row(MEGATRON, "gpt-310b", "a100", 1920, 8, 16, 2160, 155, "megatron"),
    Row(MEGATRON, "gpt-530b", "a100", 2520, 8, 35, 2520, 163, "megatron"),
    Row(MEGATRON, "gpt-1t", "a100", 3072, 8, 64, 3072, 163, "megatron"),
    Row(LLAMA, "llama3-405b", "h100", 8192, 8, 16, 2048, 430, "model", calibration=True),
    Row(LLAMA, "llama3-405b", "h100", 16384, 8, 16, 2048, 400, "model"),
]


def job_for(row: Row, hw: Hardware, *, fixed: bool) -> Job:
    spec = TransformerSpec.load(row.model)
    megatron = row.paper == MEGATRON
    space = Space(chunks=(2, 4, 8), families=("1f1b", "interleaved-1f1b") if fixed else None)
    return Job(spec=spec, hardware=hw, gpus=row.gpus, global_batch_tokens=row.batch * spec.seq,
               sequence_parallel=not megatron, zero=not megatron, recompute=("full",) if megatron else RECOMPUTE,
               tensor=(row.t,) if fixed else None,
               pipeline=(row.p,) if fixed else None, space=space)


def per_gpu_tflops(row: Row, spec: TransformerSpec, step: float) -> float:
    """The paper's own per-GPU figure for a predicted step time."""
    B, s, l, h, V = row.batch, spec.seq, spec.layers, spec.hidden, spec.vocab
    if row.metric == "megatron":
        flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    else:
        flops = spec.model_flops_per_token() * B * s
    return flops / step / row.gpus / 1e12


def predict(row: Row, hw: Hardware):
    res = cluster_search(job_for(row, hw, fixed=True), keep=1)
    if not res.ranking:
        return None, None
    best = res.ranking[0]
    return per_gpu_tflops(row, TransformerSpec.load(row.model), best.step_time), best


def free_rank(row: Row, hw: Hardware) -> tuple[int | None, str]:
    """Rank (1-based) of the published t x p among the t x p layouts when asked freely (each layout
    ranked by its best configuration), and the free winner."""
    res = cluster_search(job_for(row, hw, fixed=False), keep=5, per_layout=True)
    layouts = list(dict.fromkeys((c.t, c.config.p) for c in res.ranking))
    rank = layouts.index((row.t, row.p)) + 1 if (row.t, row.p) in layouts else None
    top = res.ranking[0]
    return rank, f"t{top.t} p{top.config.p} {top.config.family} v{top.config.v}"


def calibrate(row: Row) -> float:
    """The efficiency that makes ``row``'s prediction equal its published figure (bisection)."""
    hw = Hardware.load(row.hardware)
    lo, hi = 0.2, 1.0
    for _ in range(18):
        mid = (lo + hi) / 2
        got, _ = predict(row, replace(hw, efficiency=mid))
        lo, hi = (mid, hi) if got is None or got < row.published else (lo, mid)
    return (lo + hi) / 2


def layouts(row: Row, hw: Hardware, top: int = 8) -> None:
    """Each t x p layout's best configuration for ``row``'s job, with where its step goes."""
    res = cluster_search(job_for(row, hw, fixed=False), keep=5, per_layout=True)
    best: dict = {}
    for c in res.ranking:
        best.setdefault((c.t, c.config.p), c)
    spec = TransformerSpec.load(row.model)
    for n, c in enumerate(sorted(best.values(), key=lambda c: c.step_time)[:top], 1):
        g = c.config
        print(f"{n:>3}  t{c.t} p{g.p:<3} {g.family:<17} v{g.v} mbs{g.mbs}  step {c.step_time:6.3f} s  "
              f"bubble {c.candidate.bubble:5.1%}  exposed dp {c.exposed_dp:.3f} s  "
              f"{per_gpu_tflops(row, spec, c.step_time):5.1f} TFLOP/s per GPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true", help="print the efficiency each calibration row implies")
    ap.add_argument("--quick", action="store_true", help="skip the free search (the ranking column)")
    ap.add_argument("--layouts", metavar="MODEL", help="print each t x p layout's best for this row's job")
    ap.add_argument("--free-collectives", action="store_true",
                    help="with --layouts: make the node's link infinitely fast (tensor-parallel collectives free)")
    args = ap.parse_args()
    if args.layouts:
        row = next((r for r in ROWS if r.model == args.layouts), None)
        if row is None:
            ap.error(f"--layouts {args.layouts}: not a published row; choose from {', '.join(r.model for r in ROWS)}")
        hw = Hardware.load(row.hardware)
        if args.free_collectives:
            hw = replace(hw, intra=Link(bandwidth=1e30, latency=0.0))
        layouts(row, hw)
        return
    if args.calibrate:
        for row in ROWS:
            if row.calibration:
                print(f"{row.hardware}: efficiency {calibrate(row):.4f} reproduces {row.paper} {row.model} "
                      f"on {row.gpus} GPUs ({row.published:g} TFLOP/s per GPU)")
        return
    head = (f"{'source':<25}{'model':<13}{'GPUs':>6}{'t':>3}{'p':>4}{'dp':>5}{'batch':>6}  {'published':>9}"
            f"{'predicted':>10}{'error':>8}  {'planned as':<38}{'rank of t x p':>14}  free winner")
    print(head + "\n" + "-" * len(head))
    worst, ranks_ok, t0 = 0.0, True, time.perf_counter()
    for row in ROWS:
        hw = Hardware.load(row.hardware)
        got, best = predict(row, hw)
        err = got / row.published - 1 if got else float("nan")
        worst = max(worst, abs(err))
        c = best.config
        planned = f"{c.family} v{c.v} mbs{c.mbs} rc {best.recompute}"
        rank, winner = (None, "-") if args.quick else free_rank(row, hw)
        ranks_ok &= args.quick or (rank is not None and rank <= 5)
        mark = " (calibration)" if row.calibration else ""
        print(f"{row.paper:<25}{row.model:<13}{row.gpus:>6}{row.t:>3}{row.p:>4}{row.gpus // (row.t * row.p):>5}"
              f"{row.batch:>6}  {row.published:>9.0f}{got:>10.1f}{err:>+8.1%}  {planned:<38}"
              f"{'-' if args.quick else (rank or 'none fits'):>14}  {winner}{mark}")
    print(f"\nworst error {worst:.1%} (acceptance: within 15%); published t x p in the free top 5: "
          f"{'-' if args.quick else ('yes' if ranks_ok else 'NO')}; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
