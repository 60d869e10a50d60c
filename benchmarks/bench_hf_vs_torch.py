"""A Hugging Face Llama on stagewise.Pipeline against torch.distributed.pipelining, side by side in one run.

The same transformers layers (stagewise.hf's sequence: embedding, decoder layers,
norm, LM head) cut by hand into the same stages on the same ranks, the same
schedule, p, m, batch and AdamW, on gloo with 1 thread per rank: Schedule1F1B /
1f1b, ScheduleGPipe / gpipe, ScheduleInterleaved1F1B / interleaved-1f1b (v=2),
ScheduleZBVZeroBubble / zb-v. Both are built in one process group and stepped
alternately (who goes first alternates too), so load on a shared machine hits
both alike; step time is barrier to after the optimizer step, step 0 excluded;
the ratio is the median of per-step ratios (<= 1: stagewise no slower).

    python benchmarks/bench_hf_vs_torch.py [--steps 11] [--layers 8] [--hidden 256] [--schedules 1f1b,zb-v]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

PAIRS = (("1f1b", "Schedule1F1B"), ("gpipe", "ScheduleGPipe"), ("interleaved-1f1b", "ScheduleInterleaved1F1B"),
         ("zb-v", "ScheduleZBVZeroBubble"))


def pairs(args):
    return [pr for pr in PAIRS if not args.schedules or pr[0] in args.schedules.split(",")]


def make_model(folder: str, args) -> None:
    """A small random Llama saved as an HF folder (grouped-query attention: 8 heads, 4 kv heads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                      num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=args.seq)
    LlamaForCausalLM(cfg).save_pretrained(folder)


class TorchPipe:
    """torch.distributed.pipelining on the same HF layers and stages. Mutable: weights, optimizer."""

    def __init__(self, rank: int, sched, model, args):
        import torch
        from torch import nn
        from torch.distributed import pipelining

        from stagewise.runtime.stages.stage import stage_ranges

        ranges = stage_ranges(sched, model.num_layers)
        self.mine = sched.stages_of_rank(rank)
        mods = {s: nn.Sequential(*[model.layer(i) for i in ranges[s]]) for s in self.mine}
        stages = [pipelining.PipelineStage(mods[s], s, sched.stages, torch.device("cpu")) for s in self.mine]
        cls = getattr(pipelining, args.cls_name)
        self.pipe = cls(stages if len(stages) > 1 else stages[0], args.m, loss_fn=model.loss)
        self.opt = torch.optim.AdamW([p for mod in mods.values() for p in mod.parameters()], lr=1e-3)
        self.args = args

    def step(self, ids) -> tuple[float, float]:
        import torch
        import torch.distributed as dist

        dist.barrier()
        t0 = time.perf_counter()
        losses: list = []
        self.pipe.step(*((ids,) if 0 in self.mine else ()), target=ids, losses=losses)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        loss = torch.tensor(sum(x.item() for x in losses) / self.args.m, dtype=torch.float64)
        dist.all_reduce(loss)
        return seconds, float(loss)


class OurPipe:
    """stagewise.Pipeline on the HF model (each rank builds its own layers). Mutable."""

    def __init__(self, sched, model, args):
        import torch

        from stagewise.hf.pipelined import pipeline

        self.pipe = pipeline(model, sched, static_shapes=True)
        self.opt = torch.optim.AdamW(self.pipe.parameters(), lr=1e-3)

    def step(self, ids) -> tuple[float, float]:
        import torch.distributed as dist

        dist.barrier()
        t0 = time.perf_counter()
        loss = self.pipe.step(ids, ids).loss
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0, loss


def compare(rank: int, world: int, name: str, folder: str, args) -> dict:
    from stagewise.hf import load
    from stagewise.schedules import generate

    model = load(folder)
    sched = generate(name, world, args.m)
    ours, theirs = OurPipe(sched, model, args), TorchPipe(rank, sched, model, args)
    rec = {"torch": [], "stagewise": [], "ratio": [], "loss_diff": 0.0}
    import torch

    for k in range(args.steps):
        ids = torch.randint(0, 256, (args.batch, args.seq), generator=torch.Generator().manual_seed(k))
        order = (ours, theirs) if k % 2 else (theirs, ours)
        got = {("stagewise" if who is ours else "torch"): who.step(ids) for who in order}
        rec["loss_diff"] = max(rec["loss_diff"], abs(got["torch"][1] - got["stagewise"][1]))
        if k >= 1:
            rec["torch"].append(got["torch"][0])
            rec["stagewise"].append(got["stagewise"][0])
            rec["ratio"].append(got["stagewise"][0] / got["torch"][0])
    return rec


def rank_main(folder: str, args) -> dict:
    """One rank (started by ``stagewise.launch``, gloo initialised): both runtimes, schedule by schedule."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, cls_name in pairs(args):
        args.cls_name = cls_name
        out[name] = compare(rank, world, name, folder, args)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("-m", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (+ embedding, norm, head)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=11, help="steps per runtime and schedule (the first warms up)")
    ap.add_argument("--schedules", default=None, help="comma-separated subset of " + ",".join(n for n, _ in PAIRS))
    args = ap.parse_args()
    from stagewise import launch

    folder = tempfile.mkdtemp(prefix="stagewise-bench-hf-")
    make_model(folder, args)
    t = time.time()
    out = launch(rank_main, args.p, folder, args, threads=1, timeout=600)  # rank 0's result; a failing rank is named
    print(f"Llama {args.layers} layers hidden {args.hidden} (8 heads, 4 kv) seq {args.seq}; p={args.p} m={args.m} "
          f"batch={args.batch}; gloo, 1 thread per rank; medians of {args.steps - 1} steps, ratio = median of "
          f"per-step ratios ({time.time() - t:.0f} s in all)")
    head = f"{'schedule':<18} {'torch s':>8} {'stagewise s':>11} {'ratio':>6} {'loss diff':>9}"
    print(head)
    print("-" * len(head))
    for name, rec in out.items():
        print(f"{name:<18} {statistics.median(rec['torch']):>8.3f} {statistics.median(rec['stagewise']):>11.3f} "
              f"{statistics.median(rec['ratio']):>6.3f} {rec['loss_diff']:>9.1e}")


if __name__ == "__main__":
    main()
