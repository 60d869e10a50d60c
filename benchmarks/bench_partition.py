"""stagewise's partitioner against the 2026 baseline: a dynamic program over measured per-layer costs.

The baseline is the one pytorch PR #179212 brings from torchtitan #2113 ("up to 28.9%" over a uniform split):
measure each layer's cost, then cut the layers into as many contiguous stages as the schedule has by dynamic
programming, minimising the largest stage's cost. It sees neither the schedule (which rank runs which stages,
how many micro-batches each holds) nor memory. stagewise's partition (``plan/search/partition.py`` and
``block_split.py``, as the cluster planner calls them) minimises the busiest *rank* (a rank's stages add up:
interleaved, V-shapes) within the GPU's memory, from the schedule's own programs.

Each case is one layout of a shipped model with uneven layers (the embedding, a large-vocabulary head, DeepSeek's
dense first blocks and MTP module), under 1F1B, interleaved 1F1B and ZB-V, some with a memory cap that binds.
Both splits get the same per-layer costs (the planner's analytic profile, the "measurement"), the same schedule
and the same simulator (``ClusterSearcher.finish``: the timeline plus the data-parallel step end). Printed side by
side: each split, its simulated step, its peak memory against the cap, and the baseline's step over stagewise's
(> 1: stagewise faster; a baseline that does not fit its cap cannot run, marked "no fit"); medians per schedule.

    PYTHONPATH=$PWD python benchmarks/bench_partition.py [--tiny] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from itertools import accumulate
from typing import NamedTuple

from stagewise.plan.cluster import MEGATRON, Hardware, Job, Reserve, TransformerSpec, searchers
from stagewise.plan.search import Space

#: Megatron-LM's overlap rules with any schedule (the split, not the framework, is what is compared)
ANY = replace(MEGATRON, name="megatron-any", families=None)
GIB = 2.0**30


class Case(NamedTuple):
    model: str
    gpus: int
    t: int
    p: int
    family: str
    v: int
    m: int  #: micro-batches per replica
    ep: int | None = None
    cap_gib: float | None = None  #: the memory each GPU may use (None: unbounded, the schedule alone)
    recompute: str = "off"

    @property
    def label(self) -> str:
        cap = f" cap {self.cap_gib:g} GiB" if self.cap_gib else ""
        ep = f" ep{self.ep}" if self.ep else ""
        return f"{self.model} t{self.t} p{self.p}{ep} {self.family} v{self.v} m{self.m}{cap}"


CASES = [
    # the embedding and a 128K-vocabulary head around 32 / 80 identical blocks
    Case("llama3-8b", 64, 1, 4, "1f1b", 1, 16),
    Case("llama3-8b", 64, 1, 4, "interleaved-1f1b", 2, 16),
    Case("llama3-8b", 64, 1, 4, "zb-v", 2, 16),
    Case("llama3-8b", 64, 1, 8, "1f1b", 1, 32),
    Case("llama3-8b", 64, 1, 8, "interleaved-1f1b", 2, 32),
    Case("llama3-8b", 64, 1, 8, "zb-v", 2, 32),
    Case("llama3-70b", 512, 8, 8, "1f1b", 1, 32),
    Case("llama3-70b", 512, 8, 8, "interleaved-1f1b", 4, 32),
    Case("llama3-70b", 512, 8, 8, "zb-v", 2, 32),
    # a 201K-vocabulary head on a mixture of experts
    Case("gpt-oss-120b", 64, 1, 4, "1f1b", 1, 16, ep=8),
    Case("gpt-oss-120b", 64, 1, 4, "interleaved-1f1b", 3, 16, ep=8),
    Case("gpt-oss-120b", 64, 1, 4, "zb-v", 2, 16, ep=8),
    # three dense blocks first, 58 MoE blocks, the MTP module before the head
    Case("deepseek-v3", 2048, 1, 16, "1f1b", 1, 32, ep=64),
    Case("deepseek-v3", 2048, 1, 16, "interleaved-1f1b", 2, 32, ep=64),
    Case("deepseek-v3", 2048, 1, 16, "zb-v", 2, 32, ep=64),
    # memory caps that bind: the first stages hold the most micro-batches in flight
    Case("llama3-8b", 64, 1, 8, "1f1b", 1, 32, cap_gib=34),
    Case("llama3-8b", 64, 1, 8, "interleaved-1f1b", 2, 32, cap_gib=55),
    Case("llama3-8b", 64, 1, 8, "zb-v", 2, 32, cap_gib=45),
    Case("llama3-70b", 512, 8, 8, "1f1b", 1, 32, cap_gib=28),
    Case("llama3-70b", 512, 8, 8, "interleaved-1f1b", 4, 32, cap_gib=35),
    Case("llama3-70b", 512, 8, 8, "zb-v", 2, 32, cap_gib=32),
]
TINY = [Case("llama3-8b", 16, 1, 4, "1f1b", 1, 8), Case("llama3-8b", 16, 1, 4, "zb-v", 2, 8)]


def dp_split(costs: list[float], stages: int) -> tuple[int, ...]:
    """The baseline: ``costs`` (one per layer, in order) cut into ``stages`` non-empty contiguous runs whose
    largest sum is the least possible, by dynamic programming over (stages used, layers covered); of equal
    optima, the one whose earlier stages end first. Layers per stage."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"{stages} stages of {n} layers: each stage needs at least one layer")
    prefix = list(accumulate(costs, initial=0.0))
    inf = float("inf")
    # worst[k][j]: the least largest sum of j first layers in k stages; cut[k][j]: where its last stage starts
    worst = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    worst[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                w = max(worst[k - 1][i], prefix[j] - prefix[i])
                if w < worst[k][j] * (1 - 1e-12):
                    worst[k][j], cut[k][j] = w, i
    counts, j = [], n
    for k in range(stages, 0, -1):
        i = cut[k][j]
        counts.append(j - i)
        j = i
    return tuple(reversed(counts))


def _job(case: Case, cap: float | None) -> Job:
    spec = TransformerSpec.load(case.model)
    hw = Hardware.load("h100")
    hw = replace(hw, memory=cap if cap else 2.0**50)
    dp = case.gpus // (case.t * case.p)
    return Job(spec=spec, hardware=hw, gpus=case.gpus, global_batch_tokens=dp * case.m * spec.seq,
               tensor=(case.t,), pipeline=(case.p,), micro_batch_sizes=(1,), recompute=(case.recompute,),
               expert=(case.ep,) if case.ep else None, expert_tensor=(1,) if case.ep else None,
               expert_placement=("within",), space=Space(families=(case.family,), chunks=(case.v,)),
               frameworks=(ANY,), sharding=("zero1",), reserve=Reserve())


def _searcher(case: Case, cap: float | None):
    (s,) = searchers(_job(case, cap), {})
    (c,) = [c for c in s.configs(build=False) if c.family == case.family and c.v == case.v]
    s._schedule(c.family, c.p, c.m, c.v)
    return s, c


def _simulate(case: Case, counts: tuple[int, ...]) -> tuple[float, float]:
    """(simulated step, fullest GPU's bytes) of ``counts`` on a fresh, unbounded searcher (its own caches)."""
    s, c = _searcher(case, None)
    s._split = lambda h, c: counts  # this split, not the partitioner's,
    s._played_faster = lambda pre: pre  # and not its tie variant either
    pre = s.prepare(c)
    return s.finish(pre).step_time, max(pre.memory)


def run_case(case: Case) -> dict:
    """Both splits of ``case``, simulated side by side."""
    cap = case.cap_gib * GIB if case.cap_gib else None
    s, c = _searcher(case, cap)
    h = s._schedules[(c.family, c.p, c.m, c.v)][1]
    t0 = time.perf_counter()
    ours = s._played_faster(s.prepare(c)).counts  # the split the search plays (the block split or its tie)
    ours_s = time.perf_counter() - t0
    lc = s._layer_costs(c)
    t0 = time.perf_counter()
    base = dp_split(list(lc.time), h.pieces)
    base_s = time.perf_counter() - t0
    out = {"case": case.label, "family": case.family, "cap_gib": case.cap_gib}
    for name, counts, took in (("stagewise", ours, ours_s), ("baseline", base, base_s)):
        step, peak = _simulate(case, counts)
        out[name] = {"counts": list(counts), "step": step, "peak_gib": peak / GIB,
                     "fits": cap is None or peak <= cap * (1 + 1e-9), "split_s": took}
    out["ratio"] = out["baseline"]["step"] / out["stagewise"]["step"]
    return out


def _row(r: dict) -> str:
    a, b = r["stagewise"], r["baseline"]
    mark = "" if b["fits"] else f"  baseline no fit ({b['peak_gib']:.1f} GiB > {r['cap_gib']:g})"
    mark += "" if a["fits"] else "  STAGEWISE NO FIT"
    return (f"{r['case']:<52}{a['step']:>9.3f}{b['step']:>9.3f}{r['ratio']:>7.3f}{a['peak_gib']:>8.1f}"
            f"{b['peak_gib']:>8.1f}{mark}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="two small cases (the test suite runs this)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    print(f"{'case':<52}{'ours s':>9}{'DP s':>9}{'DP/us':>7}{'ours GB':>8}{'DP GB':>8}   (step: simulated, "
          "seconds; peak: fullest GPU, GiB)")
    for case in TINY if args.tiny else CASES:
        rows.append(run_case(case))
        print(_row(rows[-1]), flush=True)
    for r in rows:
        print(f"  {r['case']}: stagewise {r['stagewise']['counts']}, baseline {r['baseline']['counts']}")
    print("\nmedian of baseline step / stagewise step (> 1: stagewise faster), per schedule, where both fit:")
    for fam in dict.fromkeys(r["family"] for r in rows):
        mine = [r["ratio"] for r in rows if r["family"] == fam and r["baseline"]["fits"]]
        print(f"  {fam:<18}{statistics.median(mine):.3f} over {len(mine)} cases (worst {min(mine):.3f}, "
              f"best {max(mine):.3f})")
    capped = [r for r in rows if r["cap_gib"]]
    if capped:
        print(f"  memory-capped: the baseline fits {sum(r['baseline']['fits'] for r in capped)} of {len(capped)}, "
              f"stagewise {sum(r['stagewise']['fits'] for r in capped)} of {len(capped)}")
    slower = [r for r in rows if r["ratio"] < 1 - 1e-9 and r["baseline"]["fits"]]
    print(f"stagewise slower than the baseline (that fits): {len(slower)} of {len(rows)} cases"
          + "".join(f"\n  {r['case']} ({r['ratio']:.4f})" for r in slower))
    print(f"\n{time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
