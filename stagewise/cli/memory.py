"""The memory options every costed command shares: what I frees, a GPT layer's M_B and M_W, a cap per rank, the
host link; and the memory actions a command places into its schedule (``--offload``, ``--recompute``)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from ..costs import Costs, MemoryCap, transformer_activation, transformer_kv_share, with_transformer_memory
from ..option_values import UsageError, finite_float, whole_int


def _fraction(text: str) -> float:
    """A fraction from 0 to 1 (of an activation)."""
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction from 0 to 1; got {text!r}")
    return value


def _positive(text: str) -> float:
    """A finite number > 0 (a count that may be fractional, such as layers per stage)."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0; got {text!r}")
    return value


def add_memory_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "memory (F allocates a stage's activation, I frees --free-at-i of it, W the rest; chunk-units are one "
        "micro-batch's activations of one stage)")
    g.add_argument("--free-at-i", type=_fraction, default=None,
                   help="fraction of an activation freed at I (the rest at W), default 0")
    g.add_argument("--hidden-size", type=whole_int, default=None,
                   help="with --heads and --seq-length: activation bytes per stage and --free-at-i from the Zero "
                        "Bubble paper's M_B = (34h + 5as)sb and M_W = 32hsb per layer; with --moe-tokens: the "
                        "all-to-all's token size")
    g.add_argument("--heads", type=whole_int, default=None, help="attention heads (a)")
    g.add_argument("--seq-length", type=whole_int, default=None, help="sequence length (s)")
    g.add_argument("--micro-batch-size", type=whole_int, default=1, help="sequences per micro-batch (b), default 1")
    g.add_argument("--layers-per-stage", type=_positive, default=1.0, help="layers in one stage, default 1")
    g.add_argument("--kv-share", type=_fraction, default=None,
                   help="with --slices: the share of a micro-batch's activations that are attention keys and values "
                        "(a slice also keeps those of the slices before it), default 0, or 4h/(34h + 5as) with "
                        "--hidden-size --heads --seq-length")
    g.add_argument("--cap", default=None, metavar="N[,N..]",
                   help="most activation per rank in chunk-units, one number or one per rank")
    g.add_argument("--cap-bytes", default=None, metavar="N[,N..]",
                   help="most activation per rank in bytes (needs --activation-bytes or --hidden-size)")
    g.add_argument("--host-bandwidth", type=finite_float, default=None,
                   help="bytes per time unit of a rank's device<->host link, which OFFLOAD and RELOAD take (chunk-"
                        "units per time unit without activation bytes); default free")
    g.add_argument("--recompute-keep", type=_fraction, default=None,
                   help="what the forward of a recomputed micro-batch keeps, in chunk-units (its input), default 0")


def add_memory_action_args(p: argparse.ArgumentParser) -> None:
    """--offload, --recompute, --recompute-at: memory actions placed into the schedule (``memory_actions.place``)."""
    g = p.add_argument_group("memory actions (placed into the schedule: stagewise.memory_actions)")
    g.add_argument("--offload", default=None, metavar="S,S,..|all",
                   help="stages whose saved activations go to host memory after each forward (OFFLOAD) and come "
                        "back one op before the backward (RELOAD), over --host-bandwidth")
    g.add_argument("--recompute", default=None, metavar="S,S,..|all",
                   help="stages whose forward keeps only its input and is redone (RECOMPUTE) before the backward")
    add_recompute_at(g)


def add_recompute_at(g, when: str = "") -> None:
    """--recompute-at: where a placed RECOMPUTE goes (``memory_actions.RECOMPUTE_AT``); ``when`` prefixes its help."""
    from ..memory_actions import RECOMPUTE_AT

    g.add_argument("--recompute-at", choices=RECOMPUTE_AT, default="backward",
                   help=f"{when}where a RECOMPUTE goes: right before its backward (default), or into the rank's idle "
                        "time before it (Mario)")


def _stages(option: str, text: str | None, stages: int):
    """'0,2' -> (0, 2), 'all', or None, each stage in range."""
    if text is None or text == "all":
        return text
    try:
        got = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{option} {text}: expected stage numbers like 0,2, or all") from None
    bad = [s for s in got if not 0 <= s < stages]
    if bad:
        raise UsageError(f"{option} {text}: stage {bad[0]} is outside the schedule's stages 0..{stages - 1}")
    return got


def placed(args: argparse.Namespace, schedule, costs: Costs):
    """``schedule`` with the memory actions of --offload, --recompute and --recompute-at placed (unchanged when
    neither is given)."""
    from ..memory_actions import place, policy_of

    off = _stages("--offload", getattr(args, "offload", None), schedule.stages)
    rec = _stages("--recompute", getattr(args, "recompute", None), schedule.stages)
    if off is None and rec is None:
        if getattr(args, "recompute_at", "backward") != "backward":
            raise UsageError("--recompute-at places the recomputes of --recompute; give --recompute STAGES too")
        return schedule
    both = sorted(set(range(schedule.stages) if off == "all" else off or ()) &
                  set(range(schedule.stages) if rec == "all" else rec or ()))
    if both:
        raise UsageError(f"--offload and --recompute both name stage {both[0]}; a stage's activations are "
                         "offloaded or recomputed, not both")
    return place(schedule, policy_of(schedule.stages, off, rec), recompute_at=args.recompute_at, costs=costs)


def memory_costs(args: argparse.Namespace, costs: Costs) -> Costs:
    """``costs`` with the memory options applied."""
    hidden, heads, seq = (getattr(args, k, None) for k in ("hidden_size", "heads", "seq_length"))
    given = [n for n, x in (("--hidden-size", hidden), ("--heads", heads), ("--seq-length", seq)) if x is not None]
    from .expert_options import derives_a2a

    if given == ["--hidden-size"] and derives_a2a(args):
        given = []  # the hidden size is the all-to-all's here, not the memory model's
    if given and len(given) < 3:
        raise UsageError(f"{given[0]} needs --hidden-size, --heads and --seq-length together")
    if given:
        act = transformer_activation(hidden, heads, seq, args.micro_batch_size, args.layers_per_stage)
        costs = replace(with_transformer_memory(costs, act), kv_share=transformer_kv_share(hidden, heads, seq))
    if getattr(args, "free_at_i", None) is not None:
        costs = replace(costs, free_at_i=args.free_at_i)
    if getattr(args, "host_bandwidth", None) is not None:
        if not args.host_bandwidth > 0:
            raise UsageError(f"--host-bandwidth must be > 0; got {args.host_bandwidth:g}")
        costs = replace(costs, host_bandwidth=args.host_bandwidth)
    if getattr(args, "recompute_keep", None) is not None:
        costs = replace(costs, recompute_keep=args.recompute_keep)
    if getattr(args, "kv_share", None) is not None:
        costs = replace(costs, kv_share=args.kv_share)
    cap = memory_cap(getattr(args, "cap", None), getattr(args, "cap_bytes", None))
    return replace(costs, cap=cap) if cap is not None else costs


def memory_cap(chunks: str | None, in_bytes: str | None) -> MemoryCap | None:
    """The cap from --cap or --cap-bytes (not both)."""
    if chunks is not None and in_bytes is not None:
        raise UsageError("give either --cap (chunk-units) or --cap-bytes, not both")
    text, unit = (chunks, "chunks") if chunks is not None else (in_bytes, "bytes")
    if text is None:
        return None
    option = "--cap" if unit == "chunks" else "--cap-bytes"
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{option} {text}: expected a number or one number per rank, comma-separated") from None
    return MemoryCap(values=values, unit=unit)
