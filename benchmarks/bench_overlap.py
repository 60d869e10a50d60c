"""The F&B pair with and without overlap: does interleaving at the all-to-alls hide them? (2 ranks, gloo)

Two ranks form one expert-parallel group (pp 1 x ep 2): each holds two stages of MoE blocks and runs a
schedule of F&B pairs, ``(0F(k+1);1B(k))`` and ``(1F(k+1);0B(k))`` (read from torch's CSV text). The same
steps run with the generic overlap (execution/fb_pair.py: the backward on a second thread, the halves
handing over at every all-to-all) and with ``overlap=False`` (the forward, then the backward: F + B), in
alternation. Measured: the median pair time of each, and of the plain F and B ops; the all-to-all alone
(the same dispatch/combine sizes, the same group); so each half's compute is its plain op minus its
all-to-alls. The simulator's pair (``stagewise.all_to_all.pair_time``) of those compute and all-to-all
times is the bound an ideal interleaving reaches; the measured interleaved pair is compared with it and
with F + B. The sizes put one forward's all-to-all near its compute (``--hidden`` tunes the ratio).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_overlap.py [--steps 12] [--d 512] [--hidden 64] [--tokens 1024]
"""

from __future__ import annotations

import argparse
import statistics
import time

PAIRS = 6  #: micro-batches: 2 plain F, 2 (m-1) pairs, 2 plain B


def schedule_text(m: int) -> str:
    """One rank, stages 0 and 1: warm-up F's, then pairs of one stage's F with the other's B, then B's."""
    ops = ["0F0", "1F0"]
    for k in range(m - 1):
        ops += [f"(0F{k + 1};1B{k})OVERLAP_F_B", f"(1F{k + 1};0B{k})OVERLAP_F_B"]
    return ",".join(ops + [f"1B{m - 1}", f"0B{m - 1}"]) + "\n"


def layers(d: int, hidden: int, blocks: int, experts: int, top_k: int):
    import torch
    from torch import nn

    import stagewise
    from stagewise import moe

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.moe = stagewise.MoE(d, experts, top_k, hidden, aux=0.01)

        def forward(self, x):
            h, aux = moe.unpack(x)
            y, a = self.moe(self.norm(h))
            return moe.pack(h + y, a if aux is None else aux + a)

    def build(i: int):
        torch.manual_seed(i)
        return Block()

    return stagewise.Layers(count=2 * blocks, build=build)


def loss_fn(out, target):
    from stagewise import moe

    h, aux = moe.unpack(out)
    return (h - target).square().mean() + aux


def rank_main(steps: int, d: int, hidden: int, tokens: int, blocks: int, experts: int, top_k: int) -> dict:
    import torch
    import torch.distributed as dist

    import stagewise
    from stagewise.actions import Pair
    from stagewise.torch_csv import loads

    sched = loads(schedule_text(PAIRS), "pairs")
    seq = 64
    rows = tokens // seq
    torch.manual_seed(0)
    x = torch.randn(rows * PAIRS * 2, seq, d)  # 2 ep ranks, PAIRS micro-batches of `tokens` tokens each
    pipes = {mode: stagewise.Pipeline(sched, layers(d, hidden, blocks, experts, top_k), loss_fn, ep=2,
                                      overlap=None if mode == "overlap" else False, static_shapes=True)
             for mode in ("overlap", "sequential")}
    times: dict[str, list] = {"overlap": [], "sequential": [], "F": [], "B": [], "waited": [], "step overlap": [],
                              "step sequential": []}
    kinds = [type(op) is Pair for op in sched.programs[0]]
    for step in range(steps + 1):
        for mode in (("overlap", "sequential") if step % 2 else ("sequential", "overlap")):
            pipe = pipes[mode]
            dist.barrier()
            res = pipe.step(x, x)
            pipe.zero_grad()
            if step == 0:
                continue  # warm-up
            spans = [e - s for s, e in res.op_seconds]
            times[mode] += [t for t, pair in zip(spans, kinds) if pair]
            times["waited"] += [exposed(p.events) for p in pipe.last_outcome.overlaps]
            times[f"step {mode}"].append(res.op_seconds[-1][1] - res.op_seconds[0][0])
            if mode == "sequential":
                times["F"] += spans[:2]
                times["B"] += spans[-2:]
    a2a = all_to_all_seconds(rows * seq * top_k, d, reps=8 * steps)
    return {"median": {k: statistics.median(v) for k, v in times.items()}, "a2a": a2a,
            "counts": {k: len(v) for k, v in times.items()}}


def exposed(events) -> float:
    """Seconds an interleaved pair's halves waited for their all-to-alls after getting the rank back."""
    resumed = {}
    total = 0.0
    for e in events:
        if e.what == "resume":
            resumed[(e.half, e.name)] = e.time
        elif e.what == "waited":
            total += e.time - resumed.pop((e.half, e.name))
    return total


def all_to_all_seconds(assignments: int, d: int, reps: int) -> float:
    """Median time of one dispatch-sized all-to-all (half of the rows to the other rank), posted and waited."""
    import torch
    import torch.distributed as dist

    buf = torch.randn(assignments, d)
    out = torch.empty_like(buf)
    times = []
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        dist.all_to_all_single(out, buf, async_op=True).wait()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per mode (each has 2 x (m-1) = 10 pairs)")
    ap.add_argument("--d", type=int, default=512, help="hidden size")
    ap.add_argument("--hidden", type=int, default=64, help="an expert's width (smaller: relatively more all-to-all)")
    ap.add_argument("--tokens", type=int, default=1024, help="tokens a rank routes per micro-batch")
    ap.add_argument("--blocks", type=int, default=2, help="MoE blocks per stage")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    args = ap.parse_args()

    import stagewise
    from stagewise.all_to_all import pair_time

    out = stagewise.launch(rank_main, 2, args.steps, args.d, args.hidden, args.tokens, args.blocks, args.experts,
                           args.top_k, timeout=120, threads=1)
    med, a = out["median"], out["a2a"]
    a_half = 2 * args.blocks * a  # dispatch + combine per block, per half (the backward's are the same sizes)
    c_f, c_b = med["F"] - a_half, med["B"] - a_half
    sim = pair_time(c_f, a_half, c_b, a_half, c_b / 2)
    fb = med["sequential"]
    from stagewise import Costs, metrics, simulate, torch_csv

    sched = torch_csv.loads(schedule_text(PAIRS), "pairs")
    step_sim = metrics(simulate(sched, Costs(t_f=c_f, t_b=c_b, a2a=a_half))).makespan
    step_seq = metrics(simulate(sched, Costs(t_f=med["F"], t_b=med["B"]))).makespan
    print(f"2 ranks (pp 1 x ep 2), {args.blocks} MoE blocks a stage, d={args.d}, expert width {args.hidden}, "
          f"{args.tokens} tokens a micro-batch, top-{args.top_k} of {args.experts}; medians of {out['counts']['overlap']} pairs")
    print(f"  one all-to-all (dispatch size)      {a * 1e3:8.2f} ms   -> a half's all-to-all {a_half * 1e3:.2f} ms")
    print(f"  plain F / plain B                   {med['F'] * 1e3:8.2f} / {med['B'] * 1e3:.2f} ms   (compute "
          f"{c_f * 1e3:.2f} / {c_b * 1e3:.2f} ms, all-to-all / compute {a_half / max(c_f, 1e-9):.2f} of F)")
    print(f"  F&B pair, sequential (F then B)     {fb * 1e3:8.2f} ms")
    print(f"  F&B pair, interleaved (overlap)     {med['overlap'] * 1e3:8.2f} ms   {med['overlap'] / fb:.3f}x of F + B; "
          f"its halves still waited {med['waited'] * 1e3:.2f} ms for all-to-alls")
    busy = med["overlap"] - med["waited"]
    print(f"  its compute (pair - waits)          {busy * 1e3:8.2f} ms   vs c_F + c_B = {(c_f + c_b) * 1e3:.2f} ms "
          f"sequential: {busy / (c_f + c_b):.2f}x while the transfers run beside it")
    print(f"  simulator's pair (stagewise.all_to_all) {sim * 1e3:7.2f} ms   {sim / fb:.3f}x of F + B; measured / simulated "
          f"{med['overlap'] / sim:.2f}")
    print(f"  the step ({len(sched.programs[0])} ops): measured {med['step overlap'] * 1e3:.1f} ms interleaved, "
          f"{med['step sequential'] * 1e3:.1f} ms sequential; simulated with --tf {c_f * 1e3:.1f} --tb {c_b * 1e3:.1f} "
          f"--a2a {a_half * 1e3:.1f} (ms) {step_sim * 1e3:.1f} ms, without pairs' overlap {step_seq * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
