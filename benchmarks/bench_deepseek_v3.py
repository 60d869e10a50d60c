"""DeepSeek-V3 on 2,048 H800s: the planner's prediction for the published layout, and what it picks freely.

Published (DeepSeek-V3 Technical Report, arXiv:2412.19437): Sec. 3.2, PP 16 with DualPipe, EP 64 spanning
8 nodes, ZeRO-1 data parallel, no tensor parallel, on 2,048 H800s; Sec. 4.2, 15,360 sequences of 4K per step
(the batch after its ramp); Sec. 1, 180K H800 GPU hours per trillion tokens = 1,543 tokens/s a GPU.

The H800 takes the H100's calibrated efficiencies (benchmarks/bench_published.py, where this row is held out);
``--calibrate`` prints the FP8 efficiency that would reproduce the published figure, for comparison only.
The published layout is planned as it ran: FP8, RMSNorm and MLA up-projections recomputed (report Sec.
3.2.3), under DeepSeek's own framework (DualPipe with Megatron-LM's overlap rules: no shipped framework runs
DualPipe with expert parallel); everything else follows from the model file, the hardware file and the
search. Then the search runs without constraints and with DeepSeek's own "no TP", and reports its
winner and where the published layout ranks.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_deepseek_v3.py [--calibrate] [--quick]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from stagewise.plan.cluster import MEGATRON, Hardware, Job, TransformerSpec, cluster_search
from stagewise.plan.search import Space

GPUS, SEQUENCES = 2048, 15360
PUBLISHED_TPS = 1e12 / (180e3 * 3600)  #: tokens a second per GPU: 180K GPU hours per trillion tokens
#: what the report says of how it trained: FP8, the norms' and MLA up-projections' recomputation
AS_RUN = dict(precision="fp8", recompute_modules=("layernorm", "mla_up_proj"), expert_placement=("within",))
HAI_LLM = replace(MEGATRON, name="hai-llm", title="HAI-LLM", families=("dualpipe",))
PUBLISHED = dict(tensor=(1,), pipeline=(16,), expert=(64,), expert_tensor=(1,), recompute=("selective",),
                 frameworks=(HAI_LLM,), space=Space(families=("dualpipe",)))


def job(hw: Hardware, **kw) -> Job:
    spec = TransformerSpec.load("deepseek-v3")
    return Job(spec=spec, hardware=hw, gpus=GPUS, global_batch_tokens=SEQUENCES * spec.seq, **{**AS_RUN, **kw})


def published(hw: Hardware):
    return cluster_search(job(hw, **PUBLISHED), keep=1).ranking[0]


def calibrate(hw: Hardware) -> float:
    """The FP8 efficiency at which the published layout's predicted tokens/s a GPU is the published one."""
    lo, hi = 0.2, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        got = published(replace(hw, fp8=replace(hw.fp8, efficiency=mid))).tokens_per_second / GPUS
        lo, hi = (mid, hi) if got < PUBLISHED_TPS else (lo, mid)
    return (lo + hi) / 2


def row(n, c) -> str:
    g = c.config
    return (f"{n:>3} t={c.parallelism.tp} p={g.p:<3} dp={g.dp:<4} ep={c.parallelism.expert_degree:<3} ({c.ep_nodes} node{'s' if c.ep_nodes > 1 else ''}) "
            f"{g.family:<11} m={g.m:<4} mbs={g.mbs} rc={c.recompute:<4} step {c.step_time:6.2f} s  "
            f"{c.tokens_per_second / GPUS:6.0f} tok/s/GPU  MFU {c.mfu:5.1%}  peak {max(c.candidate.memory) / 2**30:5.1f} GiB")


def rank_of(ranking, ref) -> str:
    def key(c):
        return c.parallelism.tp, c.parallelism.expert_degree, c.config.p, c.config.family

    for n, c in enumerate(ranking, 1):
        if key(c) == key(ref):
            return f"#{n}"
    return f"beyond the top {len(ranking)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibrate", action="store_true", help="print the H800 efficiency the published row implies")
    ap.add_argument("--quick", action="store_true", help="micro-batch size 1 only")
    args = ap.parse_args()
    hw = Hardware.load("h800")
    if args.calibrate:
        print(f"h800 FP8 efficiency reproducing {PUBLISHED_TPS:.0f} tokens/s a GPU: {calibrate(hw):.4f} "
              f"(shipped, the H100's: {hw.fp8.efficiency})")
    ref = published(hw)
    print(f"published layout, as planned (predicted vs {PUBLISHED_TPS:.0f} tok/s/GPU published):")
    print(row("", ref))
    sizes = (1,) if args.quick else (1, 2, 4)
    for title, kw in (("no tensor parallel (as published)", dict(tensor=(1,))), ("free", {})):
        t0 = time.perf_counter()
        res = cluster_search(job(hw, micro_batch_sizes=sizes, **kw), keep=30)
        print(f"\n{title}: {res.configurations} configurations in {time.perf_counter() - t0:.1f} s; "
              f"the published layout ranks {rank_of(res.ranking, ref)}")
        for n, c in enumerate(res.ranking[:5], 1):
            print(row(n, c))
        best = res.ranking[0]
        print(f"winner's step {best.step_time:.2f} s vs the published layout's {ref.step_time:.2f} s "
              f"({ref.step_time / best.step_time - 1:+.0%} for the published)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
