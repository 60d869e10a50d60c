"""Pipeline x FSDP2: stagewise against torch.distributed.pipelining + fully_shard (the torchtitan way), side by side.

The same built-in GPT, partition and placement on pp x fsdp ranks (default 2 x 2 = 4, gloo): torch's side is
each stage an nn.Sequential of its layers, fully_shard on every layer and on the stage (reshard_after_forward
False, as torchtitan does under pipeline parallel), torch's PipelineStage over the pp group and its schedule
(Schedule1F1B / 1f1b, ScheduleInterleaved1F1B / interleaved-1f1b v=2, ScheduleZBVZeroBubble / zb-v), which
drives FSDP with its UNSHARD/RESHARD/REDUCE_GRAD actions; each fsdp rank takes its rows of the batch; the
tied embedding/head gradients are summed by hand (torch has no ties across stages). stagewise's side is
``RunConfig(fsdp=...)``, its own gathers one stage ahead and reduce-scatters after each stage's last B/W.
Both are built in one process group and stepped alternately (who goes first alternates), step time is
barrier to after the optimizer step, step 0 excluded; the ratio is the median of per-step ratios.

    .venv/bin/python benchmarks/bench_pp_fsdp_vs_torch.py [--steps 9] [--d-model 256] [--schedules 1f1b]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

PAIRS = (("1f1b", "Schedule1F1B"), ("interleaved-1f1b", "ScheduleInterleaved1F1B"), ("zb-v", "ScheduleZBVZeroBubble"))


class TorchFSDPPipe:
    """torch.distributed.pipelining + FSDP2 on the same model, partition and placement. Mutable: the weights."""

    def __init__(self, name, cls_name, model, args, mesh):
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.distributed import pipelining
        from torch.distributed.fsdp import fully_shard

        from stagewise.runtime.stages.stage import partition
        from stagewise.schedules import generate

        self.model, self.args = model, args
        self.pp, self.fsdp = mesh["pp"].get_local_rank(), mesh["fsdp"].get_local_rank()
        p, f = mesh["pp"].size(), mesh["fsdp"].size()
        sched = generate(name, p, args.m)
        layers = model.layers().build_all()
        ranges = partition(len(layers), sched.stages)
        self.mine = mine = sched.stages_of_rank(self.pp)
        mods = {s: nn.Sequential(*[copy.deepcopy(layers[i]) for i in ranges[s]]) for s in mine}
        for mod in mods.values():
            for layer in mod:
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=mesh["fsdp"], reshard_after_forward=False)
            fully_shard(mod, mesh=mesh["fsdp"], reshard_after_forward=False)
        stages = [pipelining.PipelineStage(mods[s], s, sched.stages, torch.device("cpu"), group=mesh["pp"].get_group())
                  for s in mine]
        cls = getattr(pipelining, cls_name)
        self.pipe = cls(stages if len(stages) > 1 else stages[0], args.m, loss_fn=model.loss)
        self.first, self.last = 0 in mine, sched.stages - 1 in mine
        self.tied = ([mods[0][0].tok] if self.first else []) + ([mods[sched.stages - 1][-1]] if self.last else [])
        ends = (sched.placement[0], sched.placement[-1])
        self.tie_group = None
        if ends[0] != ends[1]:  # every rank makes every pair's group, in order
            pairs = [dist.new_group([mesh.mesh[k, r].item() for r in ends]) for k in range(f)]
            self.tie_group = pairs[self.fsdp]
        self.opt = torch.optim.AdamW([q for mod in mods.values() for q in mod.parameters()], lr=1e-3)
        self.scale = args.m * f

    def step(self, k: int) -> tuple[float, float]:
        """(seconds, loss) of step ``k``: barrier to after the optimizer step, like stagewise's."""
        import torch
        import torch.distributed as dist

        x, y = self.model.batch(k, self.args.batch)
        f = self.scale // self.args.m
        x, y = x.chunk(f)[self.fsdp], y.chunk(f)[self.fsdp]
        dist.barrier()
        t0 = time.perf_counter()
        mb_losses: list = []
        self.pipe.step(*((x,) if self.first else ()), target=y if self.last else None, losses=mb_losses)
        self._sum_tied()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        loss = torch.tensor(sum(v.item() for v in mb_losses) / self.scale, dtype=torch.float64)
        dist.all_reduce(loss)
        return seconds, float(loss)

    def _sum_tied(self) -> None:
        """Embedding and head copies get the sum of both (sharded alike) gradients: what stagewise does for a tie."""
        import torch.distributed as dist

        grads = [m.weight.grad.to_local() for m in self.tied]
        if self.tie_group is not None:
            dist.all_reduce(grads[0], group=self.tie_group)
        elif len(grads) == 2:
            total = grads[0] + grads[1]
            grads[0].copy_(total)
            grads[1].copy_(total)


def compare(rank, world, name, cls_name, model, args, mesh) -> dict:
    import torch

    from stagewise.runtime.config import RunConfig
    from stagewise.runtime.run.worker import Env, RankTrainer

    cfg = RunConfig(schedule=name, ranks=args.p, fsdp=args.fsdp, microbatches=args.m, batch=args.batch,
                    steps=args.steps, model=model, lr=1e-3, measure_memory=False)
    ours = RankTrainer(Env(rank=rank, world=world, device=torch.device("cpu"), backend="gloo"), cfg)
    theirs = TorchFSDPPipe(name, cls_name, model, args, mesh)
    rec = {"torch": [], "stagewise": [], "ratio": [], "loss_diff": 0.0}
    for k in range(args.steps):
        got = {}
        for who in ((ours, theirs) if k % 2 else (theirs, ours)):
            if who is ours:
                loss, sec = ours.step(k)
                got["stagewise"] = (sec, loss)
            else:
                got["torch"] = who.step(k)
        rec["loss_diff"] = max(rec["loss_diff"], abs(got["torch"][1] - got["stagewise"][1]))
        if k >= 1:
            rec["torch"].append(got["torch"][0])
            rec["stagewise"].append(got["stagewise"][0])
            rec["ratio"].append(got["stagewise"][0] / got["torch"][0])
    ours.result()
    return rec


def rank_main(args) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from stagewise.runtime.launching.allocator import keep_freed_memory
    from stagewise.runtime.run.models import GPTConfig

    keep_freed_memory()
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (args.fsdp, args.p), mesh_dim_names=("fsdp", "pp"))  # stagewise's grid order
    model = GPTConfig(layers_n=args.layers, d_model=args.d_model, heads=4, seq=args.seq, vocab=256)
    return {name: compare(rank, world, name, cls_name, model, args, mesh) for name, cls_name in pairs(args)}


def pairs(args):
    return [pr for pr in PAIRS if not args.schedules or pr[0] in args.schedules.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=2, help="pipeline ranks (default 2)")
    ap.add_argument("--fsdp", type=int, default=2, help="FSDP ranks per stage (default 2)")
    ap.add_argument("-m", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=6, help="transformer blocks (+ embedding and head)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=9, help="steps of each runtime per schedule (the first warms up)")
    ap.add_argument("--schedules", default=None, help="comma-separated subset of " + ",".join(n for n, _ in PAIRS))
    args = ap.parse_args()
    from stagewise import launch

    t = time.time()
    out = launch(rank_main, args.p * args.fsdp, args, threads=1, timeout=600)
    print(f"GPT {args.layers} blocks d_model={args.d_model} seq={args.seq}; pp {args.p} x fsdp {args.fsdp} = "
          f"{args.p * args.fsdp} ranks, m={args.m}, batch={args.batch}; gloo, 1 thread per rank; medians of "
          f"{args.steps - 1} steps per runtime, ratio = median of per-step ratios ({time.time() - t:.0f} s in all)")
    head = f"{'schedule':<18} {'torch s':>8} {'stagewise s':>11} {'ratio':>6} {'loss diff':>9}"
    print(head)
    print("-" * len(head))
    worst = 0.0
    for (name, _), rec in zip(pairs(args), out.values()):
        ratio = statistics.median(rec["ratio"])
        worst = max(worst, ratio)
        print(f"{name:<18} {statistics.median(rec['torch']):>8.3f} {statistics.median(rec['stagewise']):>11.3f} "
              f"{ratio:>6.3f} {rec['loss_diff']:>9.1e}")
    print(f"worst ratio {worst:.3f} (target <= 1.0)")


if __name__ == "__main__":
    main()
