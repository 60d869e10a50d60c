"""PipeOffload's claim on the simulator: how much of the activations can go to host memory at negligible cost.

Claim: Wan, Qi, Huang, Lin, Li, "PipeOffload: Improving Scalability of Pipeline Parallelism with Memory
Optimization", ICML 2025 (arXiv:2503.01328; code in sail-sg/zero-bubble-pipeline-parallelism): "in the
majority of standard configurations, at least half, and potentially all, of the activations can be offloaded
with negligible overhead".

Sizes: the GPT shapes of the same authors' Zero Bubble paper (Table 9, which PipeOffload's code base shares:
h, a of its 1.5B, 6.2B, 14.6B and 28.3B models), sequence 4096, micro-batch 1, 16-bit activations with flash
attention (no attention scores kept): M = 34 s h bytes per layer (Korthikanti et al. 2022). Hardware, our
assumption (stated, not the paper's table): an A100-class GPU at 312 TFLOP/s x 0.5 utilisation, forward FLOPs
24 s h^2 + 4 s^2 h per layer, backward twice the forward; a PCIe 4.0 x16 host link at 25 GB/s, one stream per
rank that carries both directions in turn (stagewise's host stream: conservative, PCIe is full duplex). The
ratio of a unit's host transfer to its forward time does not depend on the layers per stage, so a stage is
one forward of 1 time unit and its activation moves in ``ratio`` time units.

What is measured: p = 8, m = 24 micro-batches, 1F1B and interleaved 1F1B (v = 2); stages offloaded in the order
their activations live longest (stage 0 first), k of S stages (the fraction k / S of all activations, stages
being equal); each placed by ``memory_actions.place`` with the reload issued 1, 2 or 3 compute ops ahead of its
backward (the best kept); the step's overhead over keeping everything, and the peak activation saved on the
fullest rank. "Negligible": at most 2% of the step. The claim holds for a row when at least half the stages
offload within that.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_pipeoffload.py
"""

from __future__ import annotations

from stagewise.costs import Costs
from stagewise.memory_actions import place
from stagewise.schedules import generate
from stagewise.simulate import run

PEAK_FLOPS, UTILISATION, HOST = 312e12, 0.5, 25e9
SEQ, P, M, NEGLIGIBLE = 4096, 8, 24, 0.02
MODELS = [("1.5B", 2304, 24), ("6.2B", 4096, 32), ("14.6B", 5120, 40), ("28.3B", 6144, 48)]


def ratio(h: int, s: int = SEQ) -> float:
    """A layer's activation over the host link, in units of its forward time."""
    forward = (24 * s * h * h + 4 * s * s * h) / (PEAK_FLOPS * UTILISATION)
    return 34 * s * h / HOST / forward


def offloaded(family: str, chunks, k: int, r: float) -> tuple[float, float, int]:
    """(step, fullest rank's peak, reload lead) of ``family`` with its first ``k`` stages offloaded, at the best
    of reload leads 1..3."""
    sched = generate(family, P, M, chunks)
    costs = Costs(t_f=1.0, t_b=2.0, activation_bytes=1.0, host_bandwidth=1.0 / r)
    if k == 0:
        _, mt = run(sched, costs)
        return mt.makespan, max(mt.peak_activations), 0
    policy = tuple("offload" if s < k else "keep" for s in range(sched.stages))
    best = None
    for lead in (1, 2, 3):
        _, mt = run(place(sched, policy, reload_lead=lead), costs)
        got = (mt.makespan, max(mt.peak_activations), lead)
        best = got if best is None or got[:2] < best[:2] else best
    return best


def main() -> None:
    print(f"p={P} m={M} s={SEQ}; overhead = step with k of S stages offloaded / step keeping all - 1; "
          f"negligible <= {NEGLIGIBLE:.0%}")
    head = (f"{'model':<7}{'h':>6}{'ratio':>7}  {'schedule':<18}{'S':>3}  {'half: overhead':>15}{'peak':>9}  "
            f"{'all: overhead':>14}{'peak':>9}  {'most within 2%':>15}")
    print(head + "\n" + "-" * len(head))
    holds = 0
    rows = 0
    for name, h, _ in MODELS:
        r = ratio(h)
        for family, chunks in (("1f1b", None), ("interleaved-1f1b", 2)):
            S = P * (chunks or 1)
            base, peak0, _ = offloaded(family, chunks, 0, r)
            cells, best_k = {}, 0
            for k in range(1, S + 1):
                step, peak, lead = offloaded(family, chunks, k, r)
                over = step / base - 1
                cells[k] = (over, peak / peak0, lead)
                if over <= NEGLIGIBLE:
                    best_k = k
            half, full = cells[S // 2], cells[S]
            rows += 1
            holds += best_k >= S // 2
            print(f"{name:<7}{h:>6}{r:>7.2f}  {family:<18}{S:>3}  {half[0]:>14.1%} {half[1]:>8.0%}  "
                  f"{full[0]:>13.1%} {full[1]:>8.0%}  {best_k:>3}/{S} ({best_k / S:.0%})")
    print(f"\npeak: the fullest rank's activation peak over keeping everything. At least half of the activations "
          f"offload within {NEGLIGIBLE:.0%} of the step in {holds} of {rows} rows.")


if __name__ == "__main__":
    main()
