"""`stagewise train`'s data-parallel and recomputation options, and the memory it reports.

Not a subcommand: ``train.py`` adds these options and prints these lines.
"""

from __future__ import annotations

import dataclasses
import os

from .common import UsageError, int_list, positive_int

def add_args(p) -> None:
    g = p.add_argument_group("data parallelism and memory")
    g.add_argument("--dp", type=positive_int, default=1,
                   help="pipeline replicas (data parallel), default 1: p x dp ranks, each replica on its share of "
                   "the batch, gradients summed per stage over the replicas (under torchrun -p defaults to "
                   "WORLD_SIZE / dp)")
    g.add_argument("--recompute", action="store_true",
                   help="activation recomputation on every stage: F keeps only the stage input, the backward "
                   "redoes the forward first")
    g.add_argument("--no-memory", action="store_true",
                   help="do not count activation bytes (the count costs about 1-15%% of a small model's step)")
    g.add_argument("--recompute-stages", metavar="S,S,..", default=None,
                   help="recompute these stages only (schedule stage numbers, e.g. 0,2)")


def apply(cfg, args):
    """``cfg`` with the options above."""
    from ..runtime.launching.groups import is_torchrun

    if args.recompute and args.recompute_stages:
        raise UsageError("give either --recompute (every stage) or --recompute-stages, not both")
    cfg = dataclasses.replace(cfg, dp=args.dp, recompute=True if args.recompute else _stages(args.recompute_stages),
                              measure_memory=not args.no_memory)
    if is_torchrun() and args.ranks is None and cfg.pipelined and cfg.shards > 1:
        world = int(os.environ["WORLD_SIZE"])
        cfg = dataclasses.replace(cfg, ranks=world // cfg.shards if world % cfg.shards == 0 else world)  # else preflight
    if args.batch is None and cfg.pipelined:  # the default batch, now that --dp is known
        from ..runtime.run.config import default_batch

        cfg = dataclasses.replace(cfg, batch=default_batch(cfg.microbatches, cfg.shards))
    return cfg


def lines(res) -> list[str]:
    """Measured against predicted peak activation memory (of a ``RunResult``), one line."""
    if res.memory is None:
        return []
    from ..plan.cluster import fmt_bytes

    mem = res.memory
    pairs = ", ".join(f"{fmt_bytes(m)} / {fmt_bytes(p)}"
                      for m, p in zip(mem.peak_activation_bytes, mem.predicted_peak_activation_bytes))
    out = []
    if (res.dp or 1) > 1:
        out.append(f"data parallel: {res.dp} replicas of the {res.ranks}-rank pipeline "
                   f"({res.ranks * res.dp} ranks), gradients summed per stage over the replicas")
    out.append(f"peak activation memory per rank, measured / predicted by the simulator: {pairs}")
    if mem.peak_memory_allocated_bytes:
        out.append("torch.cuda.max_memory_allocated per rank: "
                   + ", ".join(fmt_bytes(x) for x in mem.peak_memory_allocated_bytes))
    return out


def _stages(text: str | None):
    """--recompute-stages 0,2 -> (0, 2); none given: False (no stage recomputes)."""
    return int_list("--recompute-stages", text, "stage numbers like 0,2") or False
