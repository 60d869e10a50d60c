"""Executor overhead per action: stagewise.Pipeline against torch.distributed.pipelining, side by side in one run.

Identity-like layers (a 4x4 Linear each) and tiny tensors (one row of 4 per
micro-batch), so a step's time is almost all runtime: walking the program,
posting and waiting on messages, the loss all-reduce. gloo, p ranks, one
thread each. For each schedule both runtimes are built side by side and
stepped alternately (who goes first alternates too); a step is
``step()`` alone (no optimizer). Per action = median step time / compute
actions per rank (F, B, I, W each count one). stagewise runs twice: with
``static_shapes=True`` (headers on the first step only, like torch, which
learns shapes once) and with the default (a header per message every step,
so shapes may change between steps).

    .venv/bin/python benchmarks/bench_api_overhead.py [--steps 40] [-m 8] [--schedules 1f1b,zb-v]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from datetime import timedelta

PAIRS = (("gpipe", "ScheduleGPipe", None), ("1f1b", "Schedule1F1B", None),
         ("interleaved-1f1b", "ScheduleInterleaved1F1B", 2), ("zb-v", "ScheduleZBVZeroBubble", None))
WIDTH = 4


def layers(n: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return [nn.Linear(WIDTH, WIDTH) for _ in range(n)]


def loss_fn(out, y):
    import torch.nn.functional as F

    return F.mse_loss(out, y)


class TorchPipe:
    """torch.distributed.pipelining on the same layers, partition and placement."""

    def __init__(self, rank: int, sched, cls_name: str, m: int):
        import torch
        from torch import nn
        from torch.distributed import pipelining

        from stagewise.runtime.stage import stage_ranges

        ranges = stage_ranges(sched, sched.stages)
        all_layers = layers(sched.stages)
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
    x, y = torch.randn(args.m, WIDTH), torch.randn(args.m, WIDTH)
    runs = {
        "torch": TorchPipe(rank, sched, cls_name, args.m).step,
        "static": stagewise.Pipeline(sched, layers(sched.stages), loss_fn, static_shapes=True).step,
        "dynamic": stagewise.Pipeline(sched, layers(sched.stages), loss_fn).step,
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for k in range(args.steps):
        for who in order[k % 3:] + order[:k % 3]:  # who goes first rotates
            t = timed(lambda: runs[who](x, y))
            if k >= 2:  # warm-up: shapes learned, buffers allocated
                times[who].append(t)
    per_rank = sched.num_compute_actions / sched.ranks
    return {who: statistics.median(ts) / per_rank for who, ts in times.items()} | {"actions": per_rank}


def rank_main(rank: int, world: int, port: int, args, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    out = {name: compare(rank, world, name, cls, v, args) for name, cls, v in PAIRS
           if not args.schedules or name in args.schedules.split(",")}
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40, help="steps of each runtime per schedule (2 warm up)")
    ap.add_argument("--schedules", default=None, help="comma-separated subset of " + ",".join(n for n, *_ in PAIRS))
    args = ap.parse_args()
    from stagewise.runtime.launch import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.p, port, args, q)) for r in range(args.p)]
    t = time.time()
    for p in procs:
        p.start()
    out = None
    while out is None:
        try:
            out = q.get(timeout=1)
        except Exception:  # queue.Empty: check that no rank died
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise SystemExit(f"a rank failed (exit code {dead[0]})")
    for p in procs:
        p.join()
    print(f"identity-like layers ({WIDTH}x{WIDTH} Linear), one row of {WIDTH} per micro-batch; p={args.p} m={args.m}; "
          f"gloo, 1 thread per rank; medians of {args.steps - 2} steps ({time.time() - t:.0f} s in all)")
    head = (f"{'schedule':<18} {'actions/rank':>12} {'torch us/action':>15} {'stagewise static':>16} {'ratio':>6} "
            f"{'stagewise default':>17} {'ratio':>6}")
    print(head)
    print("-" * len(head))
    for name, rec in out.items():
        tt, ts, td = (rec[k] * 1e6 for k in ("torch", "static", "dynamic"))
        print(f"{name:<18} {rec['actions']:>12.0f} {tt:>15.1f} {ts:>16.1f} {ts / tt:>6.2f} {td:>17.1f} {td / tt:>6.2f}")


if __name__ == "__main__":
    main()
