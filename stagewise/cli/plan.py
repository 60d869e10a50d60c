"""`stagewise plan`: pick the fastest schedule that fits (registers `profile` and `auto` with it).

torch is needed only by `profile` and `plan --verify`; planning itself reads
the profile's JSON and simulates.
"""

from __future__ import annotations

import math
import time

from .. import limits
from .common import UsageError, add_length_args, family_names, finite_float, positive_int, print_json, whole_int
from .planning import Destinations, ProgressBar, csv_round_trips, destinations, said_default, whole_numbers


_DESCRIPTION = (
    "Given a profile, N devices, a global batch and a memory limit, simulate every configuration "
    "(p x dp = N, schedule family, v, micro-batch size, recomputation on/off, the exact best split of layers) "
    "and rank them. Writes the winner as torch's compute-only CSV and prints the `stagewise train` command. "
    "With --model (cluster scale): each framework's own command, written for the version its line is checked "
    "against, and never a layout that framework cannot express (the plan says why).")


def _description() -> str:
    from ..plan.search import RULE

    return f"{_DESCRIPTION} Recommendation under ties: {RULE}."


def register(sub) -> None:
    from . import plan_auto, plan_cluster, plan_failures, plan_profile

    plan_profile.register(sub)
    p = sub.add_parser(
        "plan", help="search schedule x p x dp x v x m x recompute x split for the fastest that fits in memory",
        description=_DESCRIPTION)
    p.described_by = _description  # the tie rule lives in the planner: imported only when help is printed
    p.add_argument("--profile", metavar="FILE", help="a profile from `stagewise profile`")
    p.add_argument("-N", "--devices", type=positive_int, help="devices in all (p x dp)")
    p.add_argument("-G", "--global-batch", type=positive_int, help="samples per optimizer step")
    p.add_argument("--memory", default=None, metavar="SIZE", help="memory per device, e.g. 80GiB (default: no limit)")
    p.add_argument("--per-node", type=positive_int, default=None, help="devices per node (default: all in one)")
    p.add_argument("--intra-bandwidth", default=None, metavar="BYTES/S",
                   help="link inside a node, e.g. 300GB/s (default: the profile's measured link, else free)")
    p.add_argument("--intra-latency", type=finite_float, default=None, metavar="S",
                   help="seconds per message in a node")
    p.add_argument("--inter-bandwidth", default=None, metavar="BYTES/S", help="link between nodes (default: intra)")
    p.add_argument("--inter-latency", type=finite_float, default=None, metavar="S",
                   help="seconds per message across nodes")
    p.add_argument("--state-factor", type=finite_float, default=4.0,
                   help="bytes held per parameter byte: weights, gradients, optimizer (default 4: fp32 Adam)")
    p.add_argument("--schedules", default=None, help="comma-separated families (default: all)")
    p.add_argument("--chunks", default=None, help="v tried for families that take any v, default 2,4 (with "
                   "--model: every v that fits the layers)")
    p.add_argument("--micro-batch-sizes", default=None, help="subset of the profiled sizes (default: all)")
    p.add_argument("--recompute", choices=("both", "on", "full", "off", "selective"), default="both",
                   help="off, full (= on), selective (attention core only; with --model), or both: every one "
                   "that applies (default)")
    p.add_argument("--layout", default=None, help="a fixed split such as 'E+t*3 | t*4 | t*4 | t*5+H'")
    p.add_argument("--split", choices=("balanced", "even"), default="balanced",
                   help="balanced (default): the fastest split that fits; even: the blocks divided equally over the "
                        "stages, the embedding with the first and the head with the last, as Megatron-LM and "
                        "torchtitan run with no layout flags (a p x v that does not divide the blocks is skipped)")
    p.add_argument("--top", type=positive_int, default=10, help="rows of the table, default 10")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="FILE.csv: the winner as torch's CSV (default: plan.csv in the current folder); FILE.md "
                        "or FILE.json: the whole plan written down (inputs, assumptions, results, commands, version), "
                        "with the winner's CSV beside it as FILE.csv")
    p.add_argument("--memory-reserve", default=None, metavar="SIZE|PCT",
                   help="memory kept free on every device, e.g. 6GiB or 10%% (with --model: default the hardware "
                        "file's reserve, CUDA context + communication buffers + fragmentation; with --memory: 0)")
    p.add_argument("--auto", action="store_true", help="also search an `auto` order for the best configurations")
    p.add_argument("--verify", type=whole_int, nargs="?", const=3, default=None, metavar="K",
                   help="run the top K (default 3) runnable configurations for real and compare")
    p.add_argument("--steps", type=positive_int, default=5, help="steps per verified run and round, default 5")
    p.add_argument("--rounds", type=positive_int, default=2,
                   help="verified runs alternate in this many rounds, default 2")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (with --model: as -o plan.json writes it)")
    add_length_args(p, distribution=True)
    plan_cluster.add_options(p)
    plan_failures.add_options(p)
    p.set_defaults(func=cmd_plan)
    plan_auto.register(sub)


def cmd_plan(args) -> int:
    from ..plan.errors import PlanError
    from . import plan_cluster

    try:
        if plan_cluster.wants_cluster(args):
            if args.lengths is not None:
                raise UsageError("--lengths plans a length distribution from a --profile; with --model the "
                                 "cluster planner costs one --seq-length")
            return plan_cluster.run(args)
        if args.recompute == "selective":
            raise UsageError("--recompute selective needs --model: a measured profile cannot tell the attention "
                             "core from the rest of a layer")
        for opt, given in (("--slices", args.slices), ("--offload", args.offload)):
            if given is not None:
                raise UsageError(f"{opt} belongs to planning with --model: sequence slices and offload are costed "
                                 "from the model and hardware files (the host link's bandwidth)")
        missing = [o for o, v in (("--profile", args.profile), ("-N/--devices", args.devices),
                                  ("-G/--global-batch", args.global_batch)) if v is None]
        if missing:
            raise UsageError(f"plan needs {', '.join(missing)} (or --model, --hardware, --gpus and "
                             "--global-batch-tokens to plan a cluster from model and hardware files)")
        return _plan(args)
    except PlanError as e:
        raise UsageError(str(e)) from None


def _plan(args) -> int:
    from ..split import Split
    from ..plan.search import Profile
    from ..plan.search import Searcher, Space, search

    if args.global_batch < 1:
        raise UsageError(f"--global-batch must be >= 1; got {args.global_batch}")
    from ..flags import FLAGS, PLANNER_ALIASES, planner_dest

    for name in PLANNER_ALIASES:  # the degrees to try are the cluster planner's; the profile's tries every p x dp
        if getattr(args, planner_dest(name)) is not None:
            raise UsageError(f"{FLAGS[name]} belongs to planning with --model: from a measured profile every p x dp "
                             "= -N is tried (no tensor or expert parallelism)")
    if args.layout is not None and args.split != "balanced":
        raise UsageError(f"--layout fixes the split; --split {args.split} cannot be given with it")
    if args.verify is not None and args.verify < 1:
        raise UsageError(f"--verify K must be >= 1; got {args.verify}")
    limits.RANKS.check(args.devices, "--devices")  # every p x dp = N is tried: N bounds the search
    out = destinations(args)  # before the search: a bad destination costs nothing
    prof = Profile.load(args.profile)
    cluster = _cluster(args, prof)
    fams = family_names(args.schedules)
    sizes = whole_numbers(args.micro_batch_sizes, "--micro-batch-sizes") if args.micro_batch_sizes is not None else None
    for b in sizes or ():
        prof.size_index(b)
    rc = {"both": (False, True), "on": (True,), "full": (True,), "off": (False,)}[args.recompute]
    counts = Split.parse(args.layout, prof.symbols).counts if args.layout is not None else None
    chunks = tuple(whole_numbers(args.chunks if args.chunks is not None else "2,4", "--chunks"))
    space = Space(families=fams, chunks=chunks, micro_batch_sizes=sizes, recompute=rc, counts=counts,
                  split=args.split)
    _check_search_size(args, prof, cluster, space)
    searcher = Searcher(profile=prof, cluster=cluster, global_batch=args.global_batch, space=space,
                        lengths=_distribution(args))
    t0 = time.perf_counter()
    with ProgressBar(enabled=not args.json) as bar:
        cands = search(searcher, bar.update)
    elapsed = time.perf_counter() - t0
    if not cands[0].fits:
        raise UsageError(_nothing_fits(cands, cluster, args))
    if args.auto:
        from ..plan.auto import refine

        cands = refine(searcher, cands)
    return _report(args, prof, cluster, cands, elapsed, searcher, out)


def _distribution(args):
    """--lengths FILE as the distribution to plan for (None without it)."""
    if args.lengths is None:
        if args.attention_share or args.reference_length is not None:
            raise UsageError("--attention-share and --reference-length set what --lengths costs: give --lengths FILE")
        return None
    for flag, on in (("--auto", args.auto), ("--verify", args.verify is not None)):
        if on:
            raise UsageError(f"{flag} runs or searches micro-batches alike; plan --lengths without it")
    from ..lengths import Distribution, read

    return Distribution(read(args.lengths, "--lengths"), args.attention_share, args.reference_length)


def _report(args, prof, cluster, cands, elapsed, searcher, out: Destinations) -> int:
    from .. import torch_csv
    from ..plan.search import table, train_command, why
    from ..plan.search import local_markdown, local_plan

    best = cands[0]
    csv_ok = csv_round_trips(best.schedule)
    try:
        torch_csv.dump(best.schedule, out.csv)
    except OSError as e:
        raise UsageError(f"-o {out.csv}: cannot write: {e.strerror}") from None
    from . import plan_failures

    faults = plan_failures.cost(args, prof, best)
    command = train_command(best, prof, out.csv if csv_ok else None, args.global_batch)
    if faults is not None:  # the suggested interval, as the run's options
        command = plan_failures.saving(command, faults)
    verified = None
    if args.verify is not None:
        from ..profiling.verify import verify

        verified = verify(prof, cands, args.verify, steps=args.steps, rounds=args.rounds,
                          log=None if args.json else print)
    result = {"searched": len(cands), "seconds": elapsed, "best": best.to_dict(), "why": why(cands),
              "csv": out.csv, "train": command, "ranking": [c.to_dict() for c in cands], "verify": verified}
    if faults is not None:
        result["failures"] = faults.to_dict()
    if searcher.lengths is not None:
        result["lengths"] = searcher.lengths.to_dict()
    plan = local_plan(argv=out.argv, profile=prof, cluster=cluster, result=result, top=args.top)
    out.write(plan, local_markdown(plan, table(cands, prof.symbols, args.top)))
    if args.json:
        print_json(result)
        return 0
    fits = sum(c.fits for c in cands)
    limit = "no memory limit" if cluster.memory is None else f"{fits} fit in {_fmt(cluster.memory)} per device"
    print(f"searched {len(cands)} configurations in {elapsed:.2f} s ({limit}); " + _band_line(best) + "\n")
    if searcher.lengths is not None:
        d = searcher.lengths.to_dict()
        print(f"each step over its micro-batches of {d['samples']} sample lengths {d['min']}..{d['max']} (mean "
              f"{d['mean']:.4g}; the profile's times at {d['reference_length']:.4g} tokens, attention share "
              f"{d['attention_share']:g})\n")
    print(table(cands, prof.symbols, args.top))
    print(f"\n{why(cands)}")
    print(f"wrote {out.csv} (torch compute-only CSV of the winner, {best.schedule.ranks} ranks){said_default(args)}")
    if out.plan:
        print(f"wrote {out.plan} (the plan: inputs, assumptions, results and the command; stagewise "
              f"{plan['stagewise']})")
    for line in plan_failures.lines(faults):
        print(line)
    print(f"run it: {command}")
    if verified:
        from ..profiling.verify import verify_table

        print("\n" + verify_table(verified))
    return 0


def _band_line(best) -> str:
    """The error band the profile's measured spread gives (none in profiles made before it was measured)."""
    if best.band is None:
        return "no error band: this profile records no measured spread (re-run `stagewise profile` for one)"
    return f"error band ±{best.band:.1%} (the profile's measured spread)"


def _check_search_size(args, prof, cluster, space) -> None:
    """The actions of every schedule the search would make (an upper bound), before it makes any."""
    from ..schedules import FAMILIES

    layers, total = len(prof.layers), 0
    for p, dp in cluster.layouts():
        for b in space.micro_batch_sizes or prof.micro_batch_sizes:
            if args.global_batch % (dp * b) == 0:
                m = args.global_batch // (dp * b)
                total += sum(p * v * m * (3 if fam.split_backward else 2)
                             for fam in (FAMILIES[f] for f in space.families or FAMILIES)
                             for v in fam.chunks or space.chunks if p * v <= layers)
    limits.PLAN_ACTIONS.check(total, "", detail=f"-N {args.devices} -G {args.global_batch}: the schedules to search "
                              f"make up to {total} actions (narrow it: --schedules, --micro-batch-sizes, -G)")


def _nothing_fits(cands, cluster, args) -> str:
    from ..plan.search import fmt_bytes

    least = min(cands, key=lambda c: max(c.memory))
    return (f"--memory {args.memory}: nothing fits in {fmt_bytes(cluster.memory)} per device; the least any of the "
            f"{len(cands)} configurations needs is {fmt_bytes(max(least.memory))} ({least.config.label()}); give "
            f"--memory {_ceil_size(max(least.memory))} or more, or more --devices")


def _ceil_size(n: float) -> str:
    mib = -(-n // 2**20)
    return f"{mib / 1024:.3g}GiB" if mib >= 1024 else f"{int(mib)}MiB"


def _fmt(n: float) -> str:
    from ..plan.search import fmt_bytes

    return fmt_bytes(n)


def _cluster(args, prof):
    from ..plan.search import Cluster, parse_bytes
    from ..plan.search import Link

    base = prof.link or Link(latency=0.0, bandwidth=float("inf"))
    intra = Link(latency=args.intra_latency if args.intra_latency is not None else base.latency,
                 bandwidth=parse_bytes(args.intra_bandwidth, "--intra-bandwidth") if args.intra_bandwidth
                 else base.bandwidth)
    inter = Link(latency=args.inter_latency if args.inter_latency is not None else intra.latency,
                 bandwidth=parse_bytes(args.inter_bandwidth, "--inter-bandwidth") if args.inter_bandwidth
                 else intra.bandwidth)
    for name, v in (("--intra-latency", intra.latency), ("--inter-latency", inter.latency)):
        if v < 0:
            raise UsageError(f"{name} must be >= 0; got {v}")
    memory = parse_bytes(args.memory, "--memory") if args.memory else None
    if args.memory_reserve is not None:
        from ..plan.cluster import parse_reserve

        if memory is None:
            raise UsageError("--memory-reserve needs --memory (the reserve is kept free of each device's memory)")
        if math.isfinite(memory):
            memory -= parse_reserve(args.memory_reserve, memory).bytes(memory)
    for name, v in (("--memory", memory), ("--intra-bandwidth", intra.bandwidth if args.intra_bandwidth else 1.0),
                    ("--inter-bandwidth", inter.bandwidth if args.inter_bandwidth else 1.0)):
        if v is not None and not math.isfinite(v):
            raise UsageError(f"{name} must be a finite size; got {v}")
    if args.state_factor < 1:
        raise UsageError(f"--state-factor must be >= 1 (the weights themselves); got {args.state_factor}")
    return Cluster(devices=args.devices, per_node=args.per_node or args.devices, memory=memory, intra=intra,
                   inter=inter, state_factor=args.state_factor)
