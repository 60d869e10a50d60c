"""Published rows vs the analytic planner: Megatron-LM SC21 Table 1, Llama 3 Table 4, Megatron-Core's weak scaling.

For each published configuration (model, GPUs, tensor x pipeline, global batch) the
planner predicts the step time of that layout (the best micro-batch size, v, split and
recomputation it finds for the published t, p and the schedules of the framework that
ran it, under that framework's overlap rules) and converts it to the source's own
per-GPU figure; then it is asked freely (same GPUs, same batch, every t x p x family x v
x micro-batch size x recomputation) and the rank of the published t x p in its ranking
is reported.

Sources (numbers copied from the sources; each row names its cluster's interconnect):
- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
  Using Megatron-LM", SC21, arXiv:2104.04473, Table 1: GPT models, vocabulary 51,200,
  sequence 2,048, A100 80GB on Selene (eight 200 Gb/s HDR InfiniBand adapters per
  node), activation recomputation on; the per-GPU teraFLOP/s counts the
  recomputation: F = 96 B s l h^2 (1 + s/6h + V/16lh) (their eq. 3). Megatron's 2021
  code had neither sequence parallelism nor a sharded optimizer.
- Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 4: 405B on H100s
  (Sec. 3.3.1: 400 Gbps RoCE or InfiniBand per GPU), TP 8, CP 1, PP 16, DP 64 and 128,
  sequence 8,192, 16M tokens per batch, 430 and 400 TFLOPs/GPU (43% and 41% BF16
  MFU); FSDP without resharding after the forward (Sec. 3.3.2). Planned as it ran, without
  activation recomputation and with the planner's memory check off: its memory model puts
  the layout at 88 GiB per GPU (143 layer-micro-batches of 0.5 GiB at rank 0), and whatever
  Llama 3 saved beyond it is not modelled. The long-context row (CP 16) is left out:
  context parallelism is not modelled.
- Megatron-LM README, "Performance Benchmarking" (Megatron-Core r0.8.0, the weak-scaling
  table images/model_table.png, 2024): GPT 1.7B to 462B on 48 to 6,144 H100s, data
  parallel 48 throughout, vocabulary 131,072, sequence 4,096, with --overlap-grad-reduce,
  --overlap-param-gather and --tp-comm-overlap; per-GPU teraFLOP/s is model FLOPs (the
  table's MFU column is that / 989 TFLOP/s). Each replica runs only 4 sequences per
  pipeline rank (batch = 4 x dp x p): the few-micro-batch rows, where the bubble and
  the exposed data-parallel traffic weigh most. The README names no cluster; the rows
  assume DGX H100 nodes (NVLink 4, eight 400 Gb/s NDR InfiniBand adapters per node). The
  micro-batch size and recomputation are not given: the planner picks them (the least
  recomputation that fits).

Efficiency factors: one per GPU type, calibrated on one row each (``--calibrate``
prints the value that reproduces the calibration row, and the error band: the largest
error of the other rows of that GPU type; the shipped hardware files hold both).

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
from stagewise.plan.hardware import Hardware, Reserve
from stagewise.plan.overlap import MEGATRON, TORCHTITAN, Framework
from stagewise.plan.profile import Link
from stagewise.plan.search import Space
from stagewise.plan.transformer import TransformerSpec

#: Megatron-LM as it ran in 2021: replicated optimizer, gradients all-reduced in buckets during the backward
MEGATRON_2021 = replace(MEGATRON, sharding=("ddp",), default_sharding=("ddp",), gather="end",
                        source="Megatron-LM 2021 (SC21): data-parallel all-reduce of the gradients, no sharded "
                               "optimizer, no sequence parallelism")
SELENE = "Selene: DGX A100, NVLink 3, 8 x 200 Gb/s HDR InfiniBand per node (25 GB/s per GPU)"
META = "Meta's H100 clusters: NVLink 4, 400 Gb/s RoCE or InfiniBand per GPU (50 GB/s)"
DGX_H100 = "DGX H100 (assumed): NVLink 4, 8 x 400 Gb/s NDR InfiniBand per node (50 GB/s per GPU)"


class Row(NamedTuple):
    paper: str
    model: str
    hardware: str
    gpus: int
    t: int
    p: int
    batch: int  #: sequences per step
    published: float  #: TFLOP/s per GPU as the source counts it
    metric: str  #: "megatron" (eq. 3, with recomputation) or "model" (MFU's FLOPs)
    framework: Framework
    cluster: str  #: the cluster's interconnect, as the source gives it
    calibration: bool = False
    few: bool = False  #: a few micro-batches per replica (bubble-heavy steps)
    #: what the source says of recomputation (None: not said, the planner picks the least that fits)
    recompute: tuple[str, ...] | None = None
    #: False: the layout ran as published though the planner's memory model puts it over the GPU (Llama 3)
    memory_checked: bool = True


MEGATRON_SC21 = "Megatron-LM SC21 Table 1"
LLAMA = "Llama 3 Table 4"
MCORE = "Megatron-Core r0.8.0"
ROWS = [
    Row(MEGATRON_SC21, "gpt-1.7b", "a100", 32, 1, 1, 512, 137, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-3.6b", "a100", 64, 2, 1, 512, 138, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-7.5b", "a100", 128, 4, 1, 512, 142, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-18b", "a100", 256, 8, 1, 1024, 135, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-39b", "a100", 512, 8, 2, 1536, 138, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-76b", "a100", 1024, 8, 4, 1792, 140, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-145b", "a100", 1536, 8, 8, 2304, 148, "megatron", MEGATRON_2021, SELENE,
        calibration=True, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-310b", "a100", 1920, 8, 16, 2160, 155, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-530b", "a100", 2520, 8, 35, 2520, 163, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(MEGATRON_SC21, "gpt-1t", "a100", 3072, 8, 64, 3072, 163, "megatron", MEGATRON_2021, SELENE, recompute=("full",)),
    Row(LLAMA, "llama3-405b", "h100", 8192, 8, 16, 2048, 430, "model", TORCHTITAN, META, calibration=True,
        recompute=("off",), memory_checked=False),
    Row(LLAMA, "llama3-405b", "h100", 16384, 8, 16, 2048, 400, "model", TORCHTITAN, META, recompute=("off",),
        memory_checked=False),
    Row(MCORE, "mcore-1.7b", "h100", 48, 1, 1, 192, 408.8, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-7.1b", "h100", 96, 2, 1, 192, 465.9, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-16b", "h100", 192, 4, 1, 192, 489.1, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-32b", "h100", 384, 8, 1, 192, 459.6, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-70b", "h100", 768, 8, 2, 384, 419.7, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-119b", "h100", 1536, 8, 4, 768, 420.5, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-177b", "h100", 2304, 8, 6, 1152, 432.8, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-314b", "h100", 3072, 8, 8, 1536, 474.4, "model", MEGATRON, DGX_H100, few=True),
    Row(MCORE, "mcore-462b", "h100", 6144, 8, 16, 3072, 459.9, "model", MEGATRON, DGX_H100, few=True),
]


def job_for(row: Row, hw: Hardware, *, fixed: bool) -> Job:
    """The row's job: its t x p and its framework's schedules and rules (``fixed``), or every layout under the
    row's framework's overlap rules with every family."""
    spec = TransformerSpec.load(row.model)
    sc21 = row.paper == MEGATRON_SC21
    fw = row.framework if fixed else replace(row.framework, families=None)
    space = Space(chunks=(2, 4, 8), families=("1f1b", "interleaved-1f1b") if fixed else None)
    unchecked = fixed and not row.memory_checked
    return Job(spec=spec, hardware=replace(hw, memory=2.0**50) if unchecked else hw, gpus=row.gpus,
               global_batch_tokens=row.batch * spec.seq, sequence_parallel=not sc21,
               recompute=row.recompute if row.recompute and (fixed or row.memory_checked) else RECOMPUTE,
               tensor=(row.t,) if fixed else None, pipeline=(row.p,) if fixed else None, space=space,
               frameworks=(fw,), sharding=fw.default_sharding, reserve=Reserve() if unchecked else None)


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


def errors(rows=ROWS) -> dict:
    """row -> predicted / published - 1 with the shipped hardware files."""
    out = {}
    for row in rows:
        got, _ = predict(row, Hardware.load(row.hardware))
        out[row] = got / row.published - 1 if got else float("nan")
    return out


def bands(errs: dict) -> dict:
    """GPU type -> the error band: the largest |error| of its rows that were not calibrated on."""
    out: dict = {}
    for row, err in errs.items():
        if not row.calibration:
            out[row.hardware] = max(out.get(row.hardware, 0.0), abs(err))
    return out


def covered(errs: dict, row: Row) -> bool:
    """Whether the band made without ``row`` (the largest |error| of the other uncalibrated rows of its GPU type)
    covers its published value: a leave-one-out check of the band."""
    others = [abs(e) for r, e in errs.items() if r.hardware == row.hardware and not r.calibration and r is not row]
    return abs(errs[row]) <= max(others, default=0.0)


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
    ap.add_argument("--calibrate", action="store_true",
                    help="print the efficiency each calibration row implies and each GPU type's error band")
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
        for gpu, band in bands(errors()).items():
            print(f"{gpu}: band {band:.4f} (the largest error of its other published rows, with the shipped files)")
        return
    head = (f"{'source':<25}{'model':<12}{'GPUs':>6}{'t':>3}{'p':>4}{'dp':>5}{'batch':>6}{'m/rank':>7}"
            f"{'published':>10}{'predicted':>10}{'error':>8}{'band':>6}  {'planned as':<36}{'rank':>5}  free winner")
    print(head + "\n" + "-" * len(head))
    t0 = time.perf_counter()
    errs, rows_out = {}, []
    for row in ROWS:
        hw = Hardware.load(row.hardware)
        got, best = predict(row, hw)
        errs[row] = got / row.published - 1 if got else float("nan")
        rows_out.append((row, got, best, (None, "-") if args.quick else free_rank(row, hw)))
    worst_row = max(ROWS, key=lambda r: abs(errs[r]))
    in_top = {}
    for row, got, best, (rank, winner) in rows_out:
        c = best.config
        planned = f"{c.family} v{c.v} mbs{c.mbs} rc {best.recompute} {best.sharding}"
        in_top[row] = rank is not None and rank <= 5
        mark = " (calibration)" if row.calibration else " (few micro-batches)" if row.few else ""
        per_rank = row.batch // (row.gpus // (row.t * row.p)) / row.p
        print(f"{row.paper:<25}{row.model:<12}{row.gpus:>6}{row.t:>3}{row.p:>4}{row.gpus // (row.t * row.p):>5}"
              f"{row.batch:>6}{per_rank:>7g}{row.published:>10.1f}{got:>10.1f}{errs[row]:>+8.1%}"
              f"{'yes' if covered(errs, row) else 'NO':>6}  {planned:<36}{'-' if args.quick else (rank or '-'):>5}"
              f"  {winner}{mark}")
    big = [r for r in ROWS if not r.few]
    few = [r for r in ROWS if r.few]
    worst_few = max(abs(errs[r]) for r in few)
    cover = sum(covered(errs, r) for r in big)
    print(f"\nworst error {abs(errs[worst_row]):.1%} ({worst_row.model} on {worst_row.gpus}; acceptance: every row "
          f"within 15%: {'yes' if abs(errs[worst_row]) <= 0.15 else 'NO'}); worst of the few-micro-batch rows "
          f"{worst_few:.1%}")
    print("error bands (largest error of the uncalibrated rows per GPU type): "
          + ", ".join(f"{k} ±{v:.1%}" for k, v in bands(errs).items()))
    print(f"the band made without a row covers it (leave-one-out) on {cover} of {len(big)} large-batch rows "
          f"(acceptance: at least 11) and {sum(covered(errs, r) for r in few)} of {len(few)} few-micro-batch rows")
    tops = "-" if args.quick else (f"{sum(in_top[r] for r in big)} of {len(big)} large-batch rows, "
                                   f"{sum(in_top[r] for r in few)} of {len(few)} few-micro-batch rows")
    print(f"published t x p among the free search's top 5 layouts: {tops}; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
