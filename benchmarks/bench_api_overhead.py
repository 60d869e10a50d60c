"""Executor overhead per action: stagewise.Pipeline against torch.distributed.pipelining, side by side in one run.

Identity-like layers (a 4x4 Linear each) and tiny tensors (one row of 4 per
micro-batch), so a step's time is almost all runtime: walking the program,
posting and waiting on messages, the loss all-reduce. gloo, p ranks, one
thread each. For each schedule both runtimes are built side by side and
stepped alternately (who goes first alternates too); a step is
``step()`` alone (no optimizer). Per action = median step time / compute
actions per rank (F, B, I, W each count one); the ratio is the median of the
per-step ratios (load from other processes hits both alike). stagewise runs twice: with
``static_shapes=True`` (headers on the first step only, like torch, which
learns shapes once) and with the default (a header per message every step,
so shapes may change between steps). ``--width 512 --rows 64`` makes the same
comparison compute-bound (a user's MLP rather than runtime overhead): then
compare the step times.

    .venv/bin/python benchmarks/bench_api_overhead.py [--steps 40] [-m 8] [--schedules 1f1b,zb-v]
    .venv/bin/python benchmarks/bench_api_overhead.py --width 512 --rows 64 --steps 12
"""

from __future__ import annotations

import argparse
import statistics
import time

PAIRS = (("gpipe", "ScheduleGPipe", None), ("1f1b", "Schedule1F1B", None),
         ("interleaved-1f1b", "ScheduleInterleaved1F1B", 2), ("zb-v", "ScheduleZBVZeroBubble", None))
def layers(n: int, width: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return [nn.Linear(width, width) for _ in range(n)]


def loss_fn(out, y):
    import torch.nn.functional as F

    return F.mse_loss(out, y)


class TorchPipe:
    """torch.distributed.pipelining on the same layers, partition and placement."""

    def __init__(self, rank: int, sched, cls_name: str, m: int, width: int):
        import torch
        from torch import nn
        from torch.distributed import pipelining

        from stagewise.runtime.stages.stage import stage_ranges

        ranges = stage_ranges(sched, sched.stages)
        all_layers = layers(sched.stages, width)
        self.mine = mine = sched.stages_of_rank(rank)
        self.last = sched.placement[-1] == rank
        mods = {s: nn.Sequential(*[all_layers[i] for i in ranges[s]]) for s in mine}
        stages = [pipelining.PipelineStage(mods[s], s, sched.stages, torch.device("cpu")) for s in mine]
        self.pipe = getattr(pipelining, cls_name)(stages if len(stages) > 1 else stages[0], m, loss_fn=loss_fn)

    def step(self, x, y) -> None:
        self.pipe.step(*((x,) if 0 in self.mine else ()), target=y if self.last else None, losses=[])


def timed(fn) -> float:
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(rank: int, world: int, name: str, cls_name: str, v, args) -> dict:
    import torch

    import stagewise

    sched = stagewise.generate(name, world, args.m, v)
    w = args.width
    x, y = torch.randn(args.m * args.rows, w), torch.randn(args.m * args.rows, w)
    runs = {
        "torch": TorchPipe(rank, sched, cls_name, args.m, w).step,
        "static": stagewise.Pipeline(sched, layers(sched.stages, w), loss_fn, static_shapes=True).step,
        "dynamic": stagewise.Pipeline(sched, layers(sched.stages, w), loss_fn).step,
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for k in range(args.steps):
        for who in order[k % 3:] + order[:k % 3]:  # who goes first rotates
            t = timed(lambda: runs[who](x, y))
            if k >= 2:  # warm-up: shapes learned, buffers allocated
                times[who].append(t)
    per_rank = sched.num_compute_actions / sched.ranks
    ratios = {who: statistics.median(a / b for a, b in zip(times[who], times["torch"])) for who in runs}
    return {who: statistics.median(ts) for who, ts in times.items()} | {"actions": per_rank, "ratio": ratios}


def rank_main(args) -> dict:
    """One rank (started by ``stagewise.launch``, gloo initialised): both runtimes, schedule by schedule."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    return {name: compare(rank, world, name, cls, v, args) for name, cls, v in PAIRS
            if not args.schedules or name in args.schedules.split(",")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40, help="steps of each runtime per schedule (2 warm up)")
    ap.add_argument("--width", type=int, default=4, help="features of each Linear layer (default 4: overhead)")
    ap.add_argument("--rows", type=int, default=1, help="rows per micro-batch (default 1)")
    ap.add_argument("--schedules", default=None, help="comma-separated subset of " + ",".join(n for n, *_ in PAIRS))
    args = ap.parse_args()
    from stagewise import launch

    t = time.time()
    out = launch(rank_main, args.p, args, threads=1, timeout=300)  # rank 0's result; a failing rank is named
    w = args.width
    print(f"{w}x{w} Linear layers, {args.rows} row(s) of {w} per micro-batch; p={args.p} m={args.m}; gloo, 1 thread "
          f"per rank; medians of {args.steps - 2} steps ({time.time() - t:.0f} s in all)")
    unit = "us/action" if w * args.rows <= 64 else "ms/step"
    head = (f"{'schedule':<18} {'actions/rank':>12} {'torch ' + unit:>15} {'stagewise static':>16} {'ratio':>6} "
            f"{'stagewise default':>17} {'ratio':>6}")
    print(head)
    print("-" * len(head))
    for name, rec in out.items():
        scale = 1e6 / rec["actions"] if unit == "us/action" else 1e3
        tt, ts, td = (rec[k] * scale for k in ("torch", "static", "dynamic"))
        rs, rd = rec["ratio"]["static"], rec["ratio"]["dynamic"]
        print(f"{name:<18} {rec['actions']:>12.0f} {tt:>15.1f} {ts:>16.1f} {rs:>6.2f} {td:>17.1f} {rd:>6.2f}")
    print("ratio: median over steps of stagewise / torch, same step, both runtimes stepped back to back")


if __name__ == "__main__":
    main()
