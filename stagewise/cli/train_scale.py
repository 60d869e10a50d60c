"""`stagewise train`'s parallelism (--dp, --fsdp, --zero, --tp), recomputation and offload options (the memory
actions, as `stagewise simulate` takes them: --offload, --recompute, --recompute-at), and the memory it reports.

Not a subcommand: ``train.py`` adds these options and prints these lines.
"""

from __future__ import annotations

import dataclasses

from .common import UsageError, int_list
from ..flags import add_layout_options


def add_args(p) -> None:
    g = p.add_argument_group("data parallelism and memory")
    add_layout_options(g, ("dp", "fsdp", "reshard_after_forward", "zero", "tp"), defaults=True, more={
        "dp": "default 1: p x dp ranks (under torchrun -p defaults to WORLD_SIZE / dp)", "fsdp": "default 1",
        "zero": "default 0", "tp": "default 1: p x dp x fsdp x tp ranks in all"})
    g.add_argument("--recompute", nargs="?", const="all", default=None, metavar="S,S,..|all",
                   help="activation recomputation on these stages (no value: all): F keeps only the stage input, "
                   "the forward is redone before the backward (where --recompute-at says)")
    g.add_argument("--recompute-at", choices=("backward", "bubble"), default="backward",
                   help="where a recomputed forward runs: right before its backward (default), or as a RECOMPUTE "
                   "placed into the rank's idle time before it (Mario)")
    g.add_argument("--offload", default=None, metavar="S,S,..|all",
                   help="stages whose saved activations go to host memory after each forward (OFFLOAD) and come "
                   "back one op before the backward (RELOAD); pinned memory and a side stream on CUDA")
    g.add_argument("--no-memory", action="store_true",
                   help="do not count activation bytes (the count costs about 1-15%% of a small model's step)")
    g.add_argument("--recompute-stages", metavar="S,S,..", default=None,
                   help="recompute these stages only (schedule stage numbers, e.g. 0,2)")


def degrees(args) -> dict:
    """The parsed options that are ``Parallelism`` fields (--dp, --fsdp, --tp, --ep, --zero,
    --reshard-after-forward; -p is ``ranks``): the layout's degrees as the options give them."""
    from ..parallelism import Parallelism

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(Parallelism)
            if f.name != "pp" and hasattr(args, f.name)}


def apply(cfg, args):
    """``cfg`` with the options above."""
    from ..runtime.launching.groups import is_torchrun

    if args.recompute and args.recompute_stages:
        raise UsageError("give either --recompute (every stage) or --recompute-stages, not both")
    recompute = _stages("--recompute", args.recompute) if args.recompute else \
        _stages("--recompute-stages", args.recompute_stages)
    from ..parallelism import Parallelism
    from ..runtime.launching.groups import torchrun_env

    layout = Parallelism(pp=cfg.ranks, **degrees(args))  # every parallel option, into the one value
    if is_torchrun() and args.ranks is None and cfg.schedule is not None and layout.per_pipeline_rank > 1:
        layout = Parallelism.of_world(torchrun_env()[1], **degrees(args))  # pp: the rest of WORLD_SIZE
    cfg = dataclasses.replace(cfg, parallelism=layout,
                              recompute=recompute, recompute_at=args.recompute_at,
                              offload=_stages("--offload", args.offload), measure_memory=not args.no_memory)
    if args.batch is None and cfg.pipelined:  # the default batch, now that --dp, --fsdp and --ep are known
        from ..runtime.config import default_batch

        cfg = dataclasses.replace(cfg, batch=default_batch(cfg.microbatches, cfg.shards))
    return cfg


def lines(res) -> list[str]:
    """The grid, the model state per rank against the parallelism's share, measured against predicted peak
    activation memory (of a ``RunResult``)."""
    if res.memory is None:
        return []
    from ..plan.search import fmt_bytes

    mem = res.memory
    out = []
    dims = [(n, k) for n, k in (("dp", res.dp or 1), ("fsdp", res.fsdp), ("tp", res.tp)) if k > 1]
    if dims:
        world = res.ranks * (res.dp or 1) * res.fsdp * res.tp
        grid = " x ".join(f"{n} {k}" for n, k in [("pp", res.ranks), *dims])
        how = {"dp": "gradients all-reduced per stage" + (", optimizer state sharded (ZeRO-1)" if res.zero else ""),
               "fsdp": "FSDP2 per stage" + (" (HSDP with dp)" if res.dp and res.dp > 1 else ""),
               "tp": "tensor parallel in each stage"}
        out.append(f"ranks: {grid} = {world} ({'; '.join(how[n] for n, _ in dims)})")
    if mem.state_bytes:
        def say(d: dict) -> str:
            return "/".join("-" if d[k] is None else fmt_bytes(d[k]) for k in ("parameters", "gradients", "optimizer"))

        ranks = ", ".join(f"{say(m)} ({say(p)})" for m, p in zip(mem.state_bytes, mem.predicted_state_bytes))
        out.append(f"parameters/gradients/optimizer state per rank, held (parallelism's share): {ranks}")
    if mem.peak_activation_bytes is None:
        return out
    pairs = ", ".join(f"{fmt_bytes(m)} / {fmt_bytes(p)}"
                      for m, p in zip(mem.peak_activation_bytes, mem.predicted_peak_activation_bytes))
    out.append(f"peak activation memory per rank, measured / predicted by the simulator: {pairs}")
    if mem.peak_memory_allocated_bytes:
        out.append("torch.cuda.max_memory_allocated per rank: "
                   + ", ".join(fmt_bytes(x) for x in mem.peak_memory_allocated_bytes))
    return out


def _stages(option: str, text: str | None):
    """--recompute-stages 0,2 -> (0, 2); all -> True; none given: False (no stage)."""
    if text == "all":
        return True
    return int_list(option, text, "stage numbers like 0,2, or all") or False
