"""stagewise's runtime against torch.distributed.pipelining, side by side in one run.

The same built-in GPT, the same layer partition and placement, p, m, batch and
AdamW, on gloo: ScheduleGPipe / gpipe, Schedule1F1B / 1f1b,
ScheduleInterleaved1F1B / interleaved-1f1b (v=2), ScheduleZBVZeroBubble / zb-v.
One process group; for each pair both runtimes are built side by side and
stepped alternately (who goes first alternates too), so load from other
processes on a shared machine hits both alike; step time is barrier to after
the optimizer step, step 0 excluded (warm-up); the ratio is the median of the
per-step ratios.
The tied embedding/head weight's gradients are summed in both (torch needs it
done by hand). Prints the ratio stagewise / torch (<= 1 means stagewise is no
slower), the loss difference, and stagewise's measured vs predicted bubble.

    .venv/bin/python benchmarks/bench_runtime_vs_torch.py [--steps 13] [--d-model 256] [--schedules 1f1b,zb-v]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

PAIRS = (("gpipe", "ScheduleGPipe"), ("1f1b", "Schedule1F1B"),
         ("interleaved-1f1b", "ScheduleInterleaved1F1B"), ("zb-v", "ScheduleZBVZeroBubble"))


def pairs(args):
    return [pr for pr in PAIRS if not args.schedules or pr[0] in args.schedules.split(",")]


class TorchPipe:
    """torch.distributed.pipelining on the same model, partition and placement. Mutable: weights, optimizer."""

    def __init__(self, rank, world, name, cls_name, model, args):
        import torch
        from torch import nn
        from torch.distributed import pipelining

        from stagewise.runtime.stages.stage import partition
        from stagewise.schedules import generate

        self.model, self.args = model, args
        sched = generate(name, world, args.m)
        layers = model.layers().build_all()
        ranges = partition(len(layers), sched.stages)
        self.mine = mine = sched.stages_of_rank(rank)
        mods = {s: nn.Sequential(*[copy.deepcopy(layers[i]) for i in ranges[s]]) for s in mine}
        stages = [pipelining.PipelineStage(mods[s], s, sched.stages, torch.device("cpu")) for s in mine]
        cls = getattr(pipelining, cls_name)
        self.pipe = cls(stages if len(stages) > 1 else stages[0], args.m, loss_fn=model.loss)
        self.tied = [mods[s][0].tok.weight for s in mine if s == 0] + [mods[s][-1].weight for s in mine
                                                                      if s == sched.stages - 1]
        self.same_rank = sched.placement[0] == sched.placement[-1]
        self.opt = torch.optim.AdamW([p for mod in mods.values() for p in mod.parameters()], lr=1e-3)

    def step(self, k: int) -> tuple[float, float]:
        """(seconds, loss) of step ``k``: barrier to after the optimizer step, like stagewise's."""
        import torch
        import torch.distributed as dist

        x, y = self.model.batch(k, self.args.batch)
        dist.barrier()
        t0 = time.perf_counter()
        mb_losses: list = []
        self.pipe.step(*((x,) if 0 in self.mine else ()), target=y, losses=mb_losses)
        self._sum_tied()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        loss = torch.tensor(sum(x.item() for x in mb_losses) / self.args.m, dtype=torch.float64)
        dist.all_reduce(loss)
        return seconds, float(loss)

    def _sum_tied(self) -> None:
        """Embedding and head copies get the sum of both gradients (what stagewise does for a tie)."""
        import torch.distributed as dist

        tied = self.tied
        if not self.same_rank:
            dist.all_reduce(tied[0].grad)
        elif tied:
            total = tied[0].grad + tied[1].grad
            tied[0].grad, tied[1].grad = total, total.clone()


def compare(rank, world, name, cls_name, model, args) -> dict:
    """Both runtimes built side by side, stepped alternately (who goes first alternates too)."""
    import torch

    from stagewise.runtime.config import RunConfig
    from stagewise.runtime.run.worker import Env, RankTrainer

    # torch counts no activation bytes: neither does stagewise here unless --measure-memory
    cfg = RunConfig(schedule=name, ranks=world, microbatches=args.m, batch=args.batch, steps=args.steps,
                    model=model, lr=1e-3, measure_memory=args.measure_memory)
    ours = RankTrainer(Env(rank=rank, world=world, device=torch.device("cpu"), backend="gloo"), cfg)
    theirs = TorchPipe(rank, world, name, cls_name, model, args)
    rec = {"torch": [], "stagewise": [], "ratio": [], "loss_diff": 0.0}
    for k in range(args.steps):
        first = (ours, theirs) if k % 2 else (theirs, ours)
        got = {}
        for who in first:
            if who is ours:
                loss, sec = ours.step(k)
                got["stagewise"] = (sec, loss)
            else:
                got["torch"] = who.step(k)
        rec["loss_diff"] = max(rec["loss_diff"], abs(got["torch"][1] - got["stagewise"][1]))
        if k >= 1:  # step 0 warms up both
            rec["torch"].append(got["torch"][0])
            rec["stagewise"].append(got["stagewise"][0])
            rec["ratio"].append(got["stagewise"][0] / got["torch"][0])
    res = ours.result()
    if rank == 0:
        rec["bubble"] = (res.measured_bubble_fraction, res.predicted_bubble_fraction)
    return rec


def rank_main(args) -> dict:
    """One rank (started by ``stagewise.launch``, gloo initialised): both runtimes, schedule by schedule."""
    import torch.distributed as dist

    from stagewise.runtime.launching.allocator import keep_freed_memory
    from stagewise.runtime.run.models import GPTConfig

    keep_freed_memory()  # both runtimes run in this process with the same allocator settings
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPTConfig(layers_n=args.layers, d_model=args.d_model, heads=4, seq=args.seq, vocab=256)
    return {name: compare(rank, world, name, cls_name, model, args) for name, cls_name in pairs(args)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=2, help="ranks (default 2: one per core of a 2-core machine)")
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=6, help="transformer blocks (+ embedding and head)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=13, help="steps of each runtime per schedule (the first warms up)")
    ap.add_argument("--measure-memory", action="store_true", help="count activation bytes in stagewise too")
    ap.add_argument("--schedules", default=None, help="comma-separated subset of " + ",".join(n for n, _ in PAIRS))
    args = ap.parse_args()
    from stagewise import launch

    t = time.time()
    out = launch(rank_main, args.p, args, threads=1, timeout=600)  # rank 0's result; a failing rank is named
    n = args.steps - 1
    print(f"GPT {args.layers} blocks d_model={args.d_model} seq={args.seq}; p={args.p} m={args.m} batch={args.batch}; "
          f"gloo, 1 thread per rank; medians of {n} steps per runtime, ratio = median of per-step ratios ({time.time() - t:.0f} s in all)")
    head = (f"{'schedule':<18} {'torch s':>8} {'stagewise s':>11} {'ratio':>6} {'loss diff':>9}  "
            f"{'bubble measured':>15} {'predicted':>9} {'diff':>6}")
    print(head)
    print("-" * len(head))
    worst_ratio = worst_gap = 0.0
    for (name, cls_name), rec in zip(pairs(args), out.values()):
        tt, ts = statistics.median(rec["torch"]), statistics.median(rec["stagewise"])
        ratio = statistics.median(rec["ratio"])
        meas, pred = rec["bubble"]
        worst_ratio, worst_gap = max(worst_ratio, ratio), max(worst_gap, abs(meas - pred))
        print(f"{name:<18} {tt:>8.3f} {ts:>11.3f} {ratio:>6.3f} {rec['loss_diff']:>9.1e}  {meas:>15.1%} "
              f"{pred:>9.1%} {(meas - pred) * 100:>+5.1f}p")
    print(f"worst ratio {worst_ratio:.3f} (target <= 1.0); worst |measured - predicted| {worst_gap * 100:.1f} points "
          "(target <= 5)")


if __name__ == "__main__":
    main()
