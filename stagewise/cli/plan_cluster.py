"""`stagewise plan --model M --hardware H --gpus N --global-batch-tokens T`: plan a cluster-scale job.

No profile and no torch: the model and the GPU are described by files (or
shipped names), costed analytically, and searched over tensor x pipeline x
data parallel, schedule family, v, micro-batch size, recomputation (off, selective, full) and split.
"""

from __future__ import annotations

import re
import time

from .common import UsageError, family_names, positive_int, print_json

_TOKENS_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)\s*")
_BINARY = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def add_options(p) -> None:
    """The cluster options of `stagewise plan` (used instead of --profile, -N and -G)."""
    from ..parallelism import SHARDINGS
    from ..plan.cluster import FRAMEWORKS
    from ..flags import add_layout_options

    g = p.add_argument_group("cluster scale (instead of --profile, -N, -G)")
    g.add_argument("--model", metavar="MODEL", default=None,
                   help="a model file (JSON) or a shipped name: " + ", ".join(_shipped("models")))
    g.add_argument("--hardware", metavar="GPU", default=None,
                   help="a hardware file (JSON) or a shipped name: " + ", ".join(_shipped("hardware")))
    g.add_argument("--gpus", type=positive_int, default=None, help="GPUs in all (t x p x dp)")
    g.add_argument("--global-batch-tokens", default=None, metavar="TOKENS",
                   help="tokens per optimizer step, e.g. 16M (K, M, G are powers of 2, as the papers count)")
    add_layout_options(g, ("tp", "pp"), tried={"tp": "T,..", "pp": "P,.."}, more={
        "tp": "the degrees to try (default: every divisor of a node)", "pp": "the degrees to try (default: all)"})
    g.add_argument("--framework", choices=tuple(FRAMEWORKS), default=None,
                   help="cost and rank layouts by this framework's rules only (what overlaps with what, the "
                        "schedules it runs); default: every framework's, each with its best layout and command")
    g.add_argument("--sharding", default=None, metavar="MODE,..",
                   help=f"data-parallel sharding to try, of {', '.join(SHARDINGS)} (default: each framework's own: "
                        "ZeRO-1 for Megatron-LM, DeepSpeed and stagewise, FSDP for torchtitan)")
    g.add_argument("--hsdp-shard", default=None, metavar="S,..",
                   help="HSDP shard-group sizes to try with --sharding hsdp (default 2,4,8,16,32,64)")
    add_layout_options(g, ("ep", "etp"), tried={"ep": "EP,..", "etp": "ETP,.."}, more={
        "ep": "the degrees to try for an MoE model (default: every one that divides its experts and the "
              "data-parallel ranks); with --etp below --tp each counts the GPUs the experts spread over "
              "(Megatron-LM's --expert-model-parallel-size)",
        "etp": "the degrees to try for an MoE model: GPUs each expert is cut over, apart from attention's --tp "
               "(default: t and 1, MoE parallel folding)"})
    g.add_argument("--expert-placement", default=None, metavar="WHERE,..",
                   help="device orders to try for an MoE model: within (expert groups packed into nodes, the "
                        "pipeline outermost: Megatron-LM's default) and across (each pipeline inside a node, an "
                        "expert group's GPUs on other nodes); default both")
    g.add_argument("--precision", choices=("bf16", "fp8"), default="bf16",
                   help="the linear layers' multiplies: bf16, or fp8 at the hardware file's FP8 rate and "
                        "efficiency, their kept inputs in FP8 (Transformer Engine, torchao Float8)")
    g.add_argument("--fp8-all-gather", action="store_true",
                   help="with --precision fp8: FP8 weights, all-gathered in FP8 (half the bytes; torchao's FSDP2 "
                        "float8 all-gather, Megatron-LM --fp8-param-gather)")
    g.add_argument("--async-tp", action="store_true",
                   help="overlap the tensor-parallel collectives with the multiplies (torch's AsyncTP, Megatron-LM "
                        "--tp-comm-overlap); only the frameworks that do it are planned")
    g.add_argument("--recompute-modules", default=None, metavar="MODULE,..",
                   help="what --recompute selective recomputes, of core_attn (default), layernorm, mla_up_proj, "
                        "mlp, moe_act (Megatron-LM's --recompute-modules)")
    g.add_argument("--slices", default=None, metavar="K,..",
                   help="sequence slices per micro-batch to try (Seq1F1B: each micro-batch's sequence cut into K "
                        "equal-cost slices that flow as pipeline units, with 1F1B; default 1: whole micro-batches)")
    g.add_argument("--offload", default=None, metavar="POLICY,..",
                   help="activation offload to try, of none, all (PipeOffload: every unit's saved activations copied to "
                        "host memory after its forward and back before its backward, over the hardware file's "
                        "host_bandwidth; default none)")
    g.add_argument("--no-sequence-parallel", action="store_true",
                   help="keep norms and dropouts whole under tensor parallel (Megatron-LM 2021)")
    g.add_argument("--no-zero", action="store_true",
                   help="replicate the optimizer state: --sharding ddp (default: each framework's sharding)")


def _shipped(kind: str) -> list[str]:
    from ..plan.cluster import shipped

    return shipped(kind)


def parse_tokens(text: str) -> int:
    """'16M' -> 16 * 2**20; '2048' -> 2048; '1.5K' -> 1536 (exact: no float rounds a large count)."""
    from fractions import Fraction

    m = _TOKENS_RE.fullmatch(str(text)) if len(str(text)) <= 24 else None
    if not m:
        raise UsageError(f"--global-batch-tokens {str(text)[:30]!r}: expected a whole number of tokens such as 16M "
                         "or 4194304 (at most 24 characters)")
    value = Fraction(m[1]) * _BINARY[m[2].lower()]
    if value.denominator != 1 or value < 1:
        raise UsageError(f"--global-batch-tokens {text!r} must be a whole number of tokens >= 1")
    return int(value)


def wants_cluster(args) -> bool:
    return any(getattr(args, k, None) is not None for k in ("model", "hardware", "gpus", "global_batch_tokens"))


def run(args) -> int:
    """The cluster plan: search, table, each framework's best with its command, the written plan."""
    from ..plan.search import recommend
    from ..plan.cluster import sensitivity
    from ..plan.cluster import cluster_search
    from ..plan.cluster import cluster_why
    from .planning import ProgressBar, destinations

    job = _job(args)
    out = destinations(args)  # before the search: a bad destination costs nothing
    schedules: dict = {}
    t0 = time.perf_counter()
    with ProgressBar(enabled=not args.json) as bar:
        res = cluster_search(job, bar.update, keep=max(args.top, 1), schedules=schedules)
    elapsed = time.perf_counter() - t0
    if not res.ranking:
        raise UsageError(_nothing_fits(job, res))
    from dataclasses import replace

    from ..flags import say

    res = replace(res, not_offered={say(k): n for k, n in res.not_offered.items()})  # in the CLI's words
    reserve = job.memory_reserve.bytes(job.hardware.memory)
    rec = recommend(res.ranking[:max(args.top, 1)], reserve)  # the rows the search ranked exactly
    why = cluster_why(res.ranking, rec.tied, rec, reserve)
    sens = sensitivity(job, rec.row, schedules)
    from . import plan_failures

    faults = plan_failures.cluster_cost(args, job, rec.row)
    return _report(args, job, res, elapsed, out, why, rec, sens, faults)


def _job(args):
    from ..plan.cluster import Job
    from ..plan.cluster import Hardware, parse_reserve
    from ..plan.cluster import FRAMEWORKS
    from ..plan.search import Space
    from ..plan.cluster import TransformerSpec
    from ..flags import FLAGS, PLANNER_ALIASES, planner_dest
    from .planning import whole_numbers

    missing = [o for o, k in (("--model", "model"), ("--hardware", "hardware"), ("--gpus", "gpus"),
                              ("--global-batch-tokens", "global_batch_tokens")) if getattr(args, k) is None]
    if missing:
        raise UsageError(f"cluster planning needs {', '.join(missing)} as well (with --model, --hardware, --gpus "
                         "and --global-batch-tokens together)")
    for opt, given in (("--profile", args.profile), ("--devices", args.devices), ("--global-batch", args.global_batch),
                       ("--verify", args.verify), ("--layout", args.layout), ("--memory", args.memory),
                       ("--per-node", args.per_node), ("--intra-bandwidth", args.intra_bandwidth),
                       ("--inter-bandwidth", args.inter_bandwidth), ("--intra-latency", args.intra_latency),
                       ("--inter-latency", args.inter_latency)):
        if given is not None:
            raise UsageError(f"{opt} belongs to planning from a measured profile; with --model the --hardware file "
                             "gives memory and links")
    if args.auto:
        raise UsageError("--auto belongs to planning from a measured profile; it cannot be combined with --model")
    if args.gpus < 1:
        raise UsageError(f"--gpus must be >= 1; got {args.gpus}")
    fams = family_names(args.schedules)
    from ..plan.cluster import RECOMPUTE

    rc = {"both": RECOMPUTE, "on": ("full",)}.get(args.recompute, (args.recompute,))
    chunks = tuple(whole_numbers(args.chunks, "--chunks")) if args.chunks is not None else None  # every v that fits
    sizes = (tuple(whole_numbers(args.micro_batch_sizes, "--micro-batch-sizes")) if args.micro_batch_sizes is not None
             else (1, 2, 4))
    sharding = _names(args.sharding, "--sharding") if args.sharding is not None else None
    if args.no_zero:
        if sharding not in (None, ("ddp",)):
            raise UsageError(f"--no-zero is --sharding ddp; it cannot be combined with --sharding {args.sharding}")
        sharding = ("ddp",)
    hw = Hardware.load(args.hardware)
    reserve = parse_reserve(args.memory_reserve, hw.memory) if args.memory_reserve is not None else None
    frameworks = (FRAMEWORKS[args.framework],) if args.framework else tuple(FRAMEWORKS.values())
    shards = (tuple(whole_numbers(args.hsdp_shard, "--hsdp-shard")) if args.hsdp_shard is not None
              else (2, 4, 8, 16, 32, 64))
    if args.fp8_all_gather and args.precision != "fp8":
        raise UsageError("--fp8-all-gather keeps the weights in FP8, which FP8 compute reads: give --precision fp8 too")
    given = {planner_dest(name): (getattr(args, planner_dest(name)), FLAGS[name]) for name in PLANNER_ALIASES}
    degrees = {dest: tuple(whole_numbers(text, flag)) if text is not None else None  # named as --help lists it
               for dest, (text, flag) in given.items()}
    return Job(spec=TransformerSpec.load(args.model), hardware=hw, gpus=args.gpus,
               global_batch_tokens=parse_tokens(args.global_batch_tokens),
               sequence_parallel=not args.no_sequence_parallel, zero=not args.no_zero, **degrees,
               micro_batch_sizes=sizes, recompute=rc, space=Space(families=fams, chunks=chunks, split=args.split),
               frameworks=frameworks, sharding=sharding, hsdp_shards=shards, reserve=reserve,
               expert_placement=_words(args.expert_placement, "--expert-placement") if args.expert_placement
               else ("within", "across"),
               precision=args.precision, fp8_gather=args.fp8_all_gather, async_tp=args.async_tp,
               recompute_modules=_words(args.recompute_modules, "--recompute-modules") if args.recompute_modules
               else ("core_attn",),
               slices=tuple(whole_numbers(args.slices, "--slices")) if args.slices is not None else (1,),
               offload=_words(args.offload, "--offload") if args.offload is not None else ("none",))


def _words(text: str, option: str) -> tuple[str, ...]:
    """A comma-separated list of names (checked by the job against its own list of choices)."""
    if len(text) > 200:
        raise UsageError(f"{option} {text[:40]!r}...: at most 200 characters")
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _names(text: str, option: str) -> tuple[str, ...]:
    from ..parallelism import SHARDINGS

    names = tuple(x.strip() for x in text.split(","))
    bad = [n for n in names if n not in SHARDINGS]
    if bad or len(text) > 200:
        raise UsageError(f"{option} {text[:40]!r}: each must be one of {', '.join(SHARDINGS)} (leave the option out "
                         "for each framework's own)")
    return names


def _report(args, job, res, elapsed, out, why: str, rec, sens: list[dict], faults) -> int:
    from .. import torch_csv
    from ..plan.search import recommend
    from ..plan.cluster import commands
    from ..plan.cluster import cluster_plan, markdown
    from .planning import csv_round_trips, said_default

    best = rec.row
    schedule = full_schedule(best)
    csv_path = out.csv if csv_round_trips(schedule) else None
    try:
        torch_csv.dump(schedule, out.csv)
    except OSError as e:
        raise UsageError(f"-o {out.csv}: cannot write: {e.strerror}") from None
    reserve = job.memory_reserve.bytes(job.hardware.memory)
    picks = {name: recommend([c for c in res.ranking if c.framework == name], reserve).row for name in res.best}
    cmds = commands(picks, job, csv_path, best)
    if faults is not None and cmds.get("stagewise", (None, None))[1]:  # its run saves at the suggested interval
        from . import plan_failures

        c, cmd, note = cmds["stagewise"]
        cmds["stagewise"] = (c, plan_failures.saving(cmd, faults, c.step_time), note)
    plan = cluster_plan(argv=out.argv, job=job, res=res, commands=cmds, why=why, rec=rec, sensitivity=sens,
                        top=args.top, seconds=elapsed, csv=out.csv)
    if faults is not None:
        plan["failures"] = faults.to_dict()
    from ..plan.cluster import option_commands

    options = option_commands(best.slices, best.offload, job.spec.moe is not None)
    if options:
        plan["long_sequence"] = {opt: {name: {"flags": flags, "note": note} for name, (flags, note) in by.items()}
                                 for opt, by in options.items()}
    table = cluster_table(res.ranking[:args.top], rec.tied, best)
    out.write(plan, markdown(plan, table))
    if args.json:
        print_json(plan)
        return 0
    print(_headline(job, res, elapsed) + "\n")
    print(table)
    print(f"\n{why}")
    if sens:
        print("what moves the winner's step most: " + "; ".join(
            f"{s['input']} {s['change']} {s['delta']:+.1%}" if s["delta"] is not None else
            f"{s['input']} {s['change']}: does not fit" for s in sens))
    from . import plan_failures

    for line in plan_failures.lines(faults):
        print(line)
    print()
    for name, (c, cmd, note) in cmds.items():
        print(_framework_line(name, c, cmd, note, res.ranking))
    for why_not, n in res.not_offered.items():
        print(f"{why_not} ({n} layout{'s' if n > 1 else ''})")
    for line in _option_lines(options):
        print(line)
    print(f"\nwrote {out.csv} (torch compute-only CSV of the recommended schedule, {schedule.ranks} pipeline ranks, "
          f"{best.config.m} " + (f"units: {best.slices} slices of each micro-batch, played as 1F1B over them; Seq1F1B runs a "
                                 "micro-batch's backwards last slice first" if best.slices > 1 else "micro-batches")
          + f"){said_default(args)}")
    if out.plan:
        print(f"wrote {out.plan} (the plan: inputs, assumptions, results and commands; stagewise "
              f"{plan['stagewise']})")
    return 0


def _option_lines(options: dict) -> list[str]:
    """The recommended row's sequence slices and offload in each framework's words (``option_commands``)."""
    from ..plan.cluster import FRAMEWORKS

    out = []
    for opt, by in options.items():
        out.append(f"{opt} (the recommended row's), framework by framework:")
        for name, (flags, note) in by.items():
            out.append(f"  {FRAMEWORKS[name].title + ':':<13}" + (f"{flags}  # {note}" if flags else f"none ({note})"))
    return out


def full_schedule(c):
    """The winner's schedule at its own length (a long step is costed from a shorter stand-in: ``steady``)."""
    if c.costed_from is None:
        return c.candidate.schedule
    from ..schedules import generate

    g = c.config
    return generate(g.family, g.p, g.m, g.v)


def _headline(job, res, elapsed) -> str:
    from ..plan.search import fmt_bytes

    hw = job.hardware
    reserve = job.memory_reserve.describe(hw.memory)
    frameworks = ", ".join(fw.name for fw in job.frameworks)
    band = f"±{hw.band:.1%} (the calibration rows' largest error)" if hw.band is not None else "unknown"
    if hw.memory_band is not None:
        band += f"; memory band ±{hw.memory_band:.1%}"
    if job.precision != "bf16" or job.async_tp:
        band += "; " + ", ".join(x for x in (f"{job.precision} at {hw.linear_rate(job.precision) / 1e12:.0f} TFLOP/s"
                                              if job.precision != "bf16" else "", "AsyncTP" if job.async_tp else "")
                                  if x)
    long = sum(c.costed_from is not None for c in res.ranking)
    return (f"{job.spec.name} on {job.gpus} x {hw.name}, {job.global_batch} sequences of {job.spec.seq} per step, "
            f"costed for {frameworks}\n"
            f"memory: {fmt_bytes(hw.memory)} per GPU, {fmt_bytes(job.usable)} usable ({reserve} reserved; "
            f"--memory-reserve changes it); error band {band}\n"
            f"{res.configurations} configurations in {elapsed:.1f} s: {res.simulated} simulated"
            + (f" ({long} long steps extended from shorter ones)" if long else "")
            + f", {res.lowered} of them (per framework) played as lowered programs"
            + f", {res.pruned} slower for sure ({res.unbuilt} by the bound before building their schedule, "
            f"{res.dominated} where less recomputation fits, the rest by the bound after it), {res.too_big} do not "
            "fit")


def _framework_line(name: str, c, cmd, note: str, ranking) -> str:
    from ..plan.search import fmt_seconds
    from ..plan.cluster import FRAMEWORKS

    title = FRAMEWORKS[name].title
    where = (f"#{ranking.index(c) + 1}, {c.config.family} t={c.parallelism.tp} p={c.config.p} dp={c.config.dp} v={c.config.v} "
             f"{c.sharding}, {fmt_seconds(c.step_time)}, {c.mfu:.1%} MFU")
    line = f"{title + ':':<13}({where}) " + (cmd if cmd else f"none ({note})")
    return line + (f"  # {note}" if cmd and note else "")


def cluster_table(cands, ties: int = 0, recommended=None) -> str:
    from ..plan.search import fmt_bytes
    from ..plan.search import fmt_seconds

    moe = any(c.parallelism.expert_degree > 1 for c in cands)
    ep_head = f"{'ep/etp':>7}" if moe else ""  # expert parallel / expert tensor parallel
    long = any(c.slices > 1 or c.offload != "none" for c in cands)
    long_head = f"{'k':>3} {'offload':<8}" if long else ""  # sequence slices, activation offload
    head = (f"{'#':>3}  {'t':>2}{'p':>4}{'dp':>6}{ep_head}  {'schedule':<17}{'v':>2}{'m':>5}{'mbs':>4} {'rc':<4} {long_head}"
            f"{'sharding':<9}{'framework':<11}{'step (band)':>20}{'MFU (band)':>20}{'mem/GPU (band)':>22}"
            f"{'free':>9}{'bubble':>8}  blocks per stage")
    lines = [head, "-" * len(head)]
    for n, c in enumerate(cands, 1):
        g = c.config
        ep = f"{f'{c.parallelism.expert_degree}/{c.parallelism.expert_tp}':>7}" if moe else ""
        band, mfu = c.step_band, c.mfu_band
        step = (f"{fmt_seconds(c.step_time)} ({_short(band[0])}-{_short(band[1])})" if band
                else fmt_seconds(c.step_time))
        mfus = f"{c.mfu:.1%} ({mfu[0]:.0%}-{mfu[1]:.0%})" if mfu else f"{c.mfu:.1%}"
        shard = c.sharding_label()
        extra = f"{c.slices:>3} {c.offload:<8}" if long else ""
        mark = "*" if c is recommended else "=" if 1 < n <= ties else " "
        lines.append(f"{n:>3}{mark} {c.parallelism.tp:>2}{g.p:>4}{g.dp:>6}{ep}  {g.family:<17}{g.v:>2}"
                     f"{g.m:>5}{g.mbs:>4} {_RC[c.recompute]:<4} {extra}{shard:<9}{c.framework:<11}{step:>20}{mfus:>20}"
                     f"{_memory(c):>22}{fmt_bytes(c.headroom):>9}"
                     f"{c.candidate.bubble:>8.1%}  {_blocks(c)}")
    if ties > 1:
        lines.append(f"(=: a tie with #1, their bands overlap: #1-#{ties} cannot be ranked by speed; *: the one "
                     "recommended by the rule in `plan --help`)")
    elif recommended is not None and recommended is not cands[0]:
        lines.append("(*: the one recommended by the rule in `plan --help`)")
    return "\n".join(lines)


def _memory(c) -> str:
    """The allocator's predicted peak on the fullest GPU with its band: '61.6 GiB (49.7-73.5)'."""
    from ..plan.search import memory_cell

    return memory_cell(c.reserved, c.memory_band)


def _short(x: float) -> str:
    return f"{x:.3g}" if x >= 1 else f"{x * 1e3:.3g}m"


_RC = {"off": "off", "selective": "sel", "full": "full", "stage": "stg"}


def _blocks(c) -> str:
    from ..plan.cluster import block_counts

    b = block_counts(c.candidate.counts)
    text = " ".join([f"E+{b[0]}", *map(str, b[1:-1]), f"{b[-1]}+H"]) if len(b) > 1 else f"E+{b[0]}+H"
    return text if len(text) <= 40 else text[:37] + "..."


def _nothing_fits(job, res) -> str:
    from ..plan.search import fmt_bytes

    from ..plan.cluster import unsearched_recompute

    x = res.least_memory
    hw, need = job.hardware, max(x.memory)
    note = unsearched_recompute(job)
    reserve = job.memory_reserve
    if need <= hw.memory and reserve.bytes(hw.memory) > 0:
        return (f"--memory-reserve: none of the {res.configurations} configurations fits in the "
                f"{fmt_bytes(job.usable)} of --hardware {hw.name} left by the reserve of "
                f"{reserve.describe(hw.memory)}; the least any needs is {fmt_bytes(need)} ({x.config.label()}), "
                f"which fits only without the reserve and would fail at start-up; give more --gpus, or "
                f"--memory-reserve 0 to plan without it")
    return (f"--hardware {hw.name}: none of the {res.configurations} configurations fits in "
            f"{fmt_bytes(job.usable)} per GPU ({fmt_bytes(hw.memory)} less the reserve of "
            f"{reserve.describe(hw.memory)}); the least any needs is {fmt_bytes(need)} ({x.config.label()}); "
            f"give more --gpus or a GPU with more memory" + (f"; {note}" if note else "") + _long_hint(job))


#: from this sequence length on a refusal names the long-sequence options when they were not searched
LONG_SEQUENCE = 32768


def _long_hint(job) -> str:
    """Where a long sequence's activations did not fit: the options that cut them, if not tried."""
    if job.spec.seq < LONG_SEQUENCE or (max(job.slices) > 1 and "all" in job.offload):
        return ""
    return "; a long sequence's activations shrink with --slices 2,4,8 (Seq1F1B) or --offload all"
