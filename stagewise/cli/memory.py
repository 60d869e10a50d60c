"""The memory options every costed command shares: what I frees, a GPT layer's M_B and M_W, and a cap per rank."""

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
