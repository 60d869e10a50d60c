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
    g = p.add_argument_group("cluster scale (instead of --profile, -N, -G)")
    g.add_argument("--model", metavar="MODEL", default=None,
                   help="a model file (JSON) or a shipped name: " + ", ".join(_shipped("models")))
    g.add_argument("--hardware", metavar="GPU", default=None,
                   help="a hardware file (JSON) or a shipped name: " + ", ".join(_shipped("hardware")))
    g.add_argument("--gpus", type=positive_int, default=None, help="GPUs in all (t x p x dp)")
    g.add_argument("--global-batch-tokens", default=None, metavar="TOKENS",
                   help="tokens per optimizer step, e.g. 16M (K, M, G are powers of 2, as the papers count)")
    g.add_argument("--tensor", default=None, metavar="T,..", help="tensor-parallel degrees to try (default: "
                   "every divisor of a node)")
    g.add_argument("--pipeline", default=None, metavar="P,..", help="pipeline degrees to try (default: all)")
    g.add_argument("--expert", default=None, metavar="EP,..",
                   help="expert-parallel degrees to try for an MoE model (default: every one that divides its experts "
                        "and the data-parallel ranks)")
    g.add_argument("--no-sequence-parallel", action="store_true",
                   help="keep norms and dropouts whole under tensor parallel (Megatron-LM 2021)")
    g.add_argument("--no-zero", action="store_true",
                   help="replicate the optimizer state (default: ZeRO-1 over data parallel)")


def _shipped(kind: str) -> list[str]:
    from ..plan.datafile import shipped

    return shipped(kind)


def parse_tokens(text: str) -> int:
    """'16M' -> 16 * 2**20; '2048' -> 2048."""
    m = _TOKENS_RE.fullmatch(str(text))
    if not m:
        raise UsageError(f"--global-batch-tokens {text!r}: expected a whole number of tokens such as 16M or 4194304")
    value = float(m[1]) * _BINARY[m[2].lower()]
    if value != int(value) or value < 1:
        raise UsageError(f"--global-batch-tokens {text!r} must be a whole number of tokens >= 1")
    return int(value)


def wants_cluster(args) -> bool:
    return any(getattr(args, k, None) is not None for k in ("model", "hardware", "gpus", "global_batch_tokens"))


def run(args) -> int:
    """The cluster plan: search, table, framework options, the winner's CSV."""
    from ..plan.cluster_search import cluster_search

    job = _job(args)
    t0 = time.perf_counter()
    from .plan import _Bar

    with _Bar(enabled=not args.json) as bar:
        res = cluster_search(job, bar.update, keep=max(args.top, 1))
    elapsed = time.perf_counter() - t0
    if not res.ranking:
        raise UsageError(_nothing_fits(job, res))
    return _report(args, job, res, elapsed)


def _job(args):
    from ..plan.cluster_search import Job
    from ..plan.hardware import Hardware
    from ..plan.search import Space
    from ..plan.transformer import TransformerSpec
    from .plan import _int_list

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
    from ..plan.analytic import RECOMPUTE

    rc = {"both": RECOMPUTE, "on": ("full",)}.get(args.recompute, (args.recompute,))
    chunks = tuple(_int_list(args.chunks, "--chunks")) if args.chunks else (2, 4, 8)
    sizes = tuple(_int_list(args.micro_batch_sizes, "--micro-batch-sizes")) if args.micro_batch_sizes else (1, 2, 4)
    return Job(spec=TransformerSpec.load(args.model), hardware=Hardware.load(args.hardware), gpus=args.gpus,
               global_batch_tokens=parse_tokens(args.global_batch_tokens),
               sequence_parallel=not args.no_sequence_parallel, zero=not args.no_zero,
               tensor=tuple(_int_list(args.tensor, "--tensor")) if args.tensor else None,
               pipeline=tuple(_int_list(args.pipeline, "--pipeline")) if args.pipeline else None,
               expert=tuple(_int_list(args.expert, "--expert")) if getattr(args, "expert", None) else None,
               micro_batch_sizes=sizes, recompute=rc, space=Space(families=fams, chunks=chunks))


def _report(args, job, res, elapsed) -> int:
    from .. import torch_csv
    from ..plan.cluster import fmt_bytes
    from ..plan.frameworks import megatron_options, stagewise_command, torchtitan_options
    from .plan import _csv_round_trips

    best = res.ranking[0]
    csv_ok = _csv_round_trips(best.candidate.schedule)
    try:
        torch_csv.dump(best.candidate.schedule, args.output)
    except OSError as e:
        raise UsageError(f"-o {args.output}: cannot write: {e.strerror}") from None
    megatron, note = megatron_options(best, job)
    titan = torchtitan_options(best, job, args.output if csv_ok else None)
    summary = {"configurations": res.configurations, "simulated": res.simulated, "pruned": res.pruned,
               "too_big": res.too_big, "seconds": elapsed}
    if args.json:
        print_json({**summary, "model": job.spec.name, "hardware": job.hardware.name, "gpus": job.gpus,
                    "global_batch": job.global_batch, "best": best.to_dict(), "megatron": megatron,
                    "megatron_note": note or None, "torchtitan": titan, "csv": args.output,
                    "ranking": [c.to_dict() for c in res.ranking[:args.top]]})
        return 0
    hw = job.hardware
    print(f"{job.spec.name} on {job.gpus} x {hw.name} ({fmt_bytes(hw.memory)} each), {job.global_batch} sequences "
          f"of {job.spec.seq} per step: {res.configurations} configurations in {elapsed:.1f} s; {res.simulated} "
          f"simulated, {res.pruned} slower for sure, {res.too_big} do not fit\n")
    print(cluster_table(res.ranking[:args.top]))
    print(f"\nMegatron-LM: {megatron}" if megatron else f"\nMegatron-LM: none ({note})")
    print(f"torchtitan:  {titan}")
    print(f"stagewise:   {stagewise_command(best, job, args.output if csv_ok else None)}")
    print(f"wrote {args.output} (torch compute-only CSV of the winner's schedule, {best.candidate.schedule.ranks} "
          "pipeline ranks)")
    return 0


def cluster_table(cands) -> str:
    from ..plan.cluster import fmt_bytes
    from ..plan.explain import fmt_seconds

    moe = any(c.ep > 1 for c in cands)
    ep_head = f"{'ep':>5}" if moe else ""
    head = (f"{'#':>3}  {'t':>2}{'p':>4}{'dp':>6}{ep_head}  {'schedule':<17}{'v':>2}{'m':>5}{'mbs':>4} {'rc':<4}"
            f"{'step':>9}{'MFU':>7}{'mem/GPU':>11}{'bubble':>8}  blocks per stage")
    lines = [head, "-" * len(head)]
    for n, c in enumerate(cands, 1):
        g = c.config
        ep = f"{c.ep:>5}" if moe else ""
        lines.append(f"{n:>3}  {c.t:>2}{g.p:>4}{g.dp:>6}{ep}  {g.family:<17}{g.v:>2}{g.m:>5}{g.mbs:>4} "
                     f"{_RC[c.recompute]:<4}{fmt_seconds(c.step_time):>9}{c.mfu:>7.1%}"
                     f"{fmt_bytes(max(c.candidate.memory)):>11}{c.candidate.bubble:>8.1%}  {_blocks(c)}")
    return "\n".join(lines)


_RC = {"off": "off", "selective": "sel", "full": "full"}


def _blocks(c) -> str:
    from ..plan.frameworks import block_counts

    b = block_counts(c.candidate.counts)
    text = f"E+{b[0]} " + " ".join(map(str, b[1:-1])) + f" {b[-1]}+H" if len(b) > 1 else f"E+{b[0]}+H"
    return text if len(text) <= 48 else text[:45] + "..."


def _nothing_fits(job, res) -> str:
    from ..plan.cluster import fmt_bytes

    x = res.least_memory
    return (f"--hardware {job.hardware.name}: none of the {res.configurations} configurations fits in "
            f"{fmt_bytes(job.hardware.memory)} per GPU; the least any needs is {fmt_bytes(max(x.memory))} "
            f"({x.config.label()}); give more --gpus or a GPU with more memory")
