"""The expert-parallel all-to-all options of every costed command: given as times, or derived from the
MoE layer's shape and the link (``costs.expert_all_to_all``)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from ..costs import Costs, expert_all_to_all

#: the options that derive --a2a, with their argparse names
DERIVE = (("--moe-tokens", "moe_tokens"), ("--hidden-size", "hidden_size"), ("--moe-top-k", "moe_top_k"), ("--ep", "ep"),
          ("--a2a-bandwidth", "a2a_bandwidth"))


def add_a2a_args(p: argparse.ArgumentParser) -> None:
    from ..flags import add_layout_options
    from ..option_values import finite_float, per_stage_value, positive_int

    g = p.add_argument_group(
        "expert-parallel all-to-all (MoE): its own resource beside compute; a plain F, B or I pays it after its "
        "compute, an F&B pair hides one half's behind the other's compute, W has none")
    g.add_argument("--a2a", type=per_stage_value, metavar="T[,T..]", default=None,
                   help="all-to-all time of one forward action (dispatch + combine of the stage's MoE layers), "
                        "default 0; a comma list gives one per stage")
    g.add_argument("--a2a-b", type=per_stage_value, metavar="T[,T..]", default=None,
                   help="all-to-all time of one backward action (B or I), default --a2a")
    g.add_argument("--moe-tokens", type=positive_int, metavar="N", default=None,
                   help="tokens one rank routes per micro-batch: with --hidden-size, --moe-top-k, --ep and "
                        "--a2a-bandwidth, derive --a2a (x --layers-per-stage MoE layers)")
    g.add_argument("--moe-top-k", type=positive_int, metavar="K", default=None, help="experts each token is routed to")
    add_layout_options(g, ("ep",))
    g.add_argument("--moe-experts", type=positive_int, metavar="E", default=None,
                   help="routed experts of the group, a multiple of --ep (default --ep: one a rank)")
    g.add_argument("--a2a-bandwidth", type=finite_float, metavar="BYTES", default=None,
                   help="bytes per time unit one rank sends in an all-to-all")
    g.add_argument("--a2a-latency", type=finite_float, metavar="T", default=None,
                   help="fixed time of one all-to-all, added to the derived --a2a, default 0")


def derives_a2a(args: argparse.Namespace) -> bool:
    """Whether any option that derives --a2a from the shape was given (--hidden-size alone is the memory's)."""
    return any(getattr(args, k, None) is not None for opt, k in DERIVE if opt != "--hidden-size")


def a2a_costs(args: argparse.Namespace, costs: Costs) -> Costs:
    """``costs`` with the all-to-all options applied."""
    from ..option_values import UsageError

    a2a, a2a_b = getattr(args, "a2a", None), getattr(args, "a2a_b", None)
    latency = getattr(args, "a2a_latency", None)
    if latency is not None and not 0 <= latency:
        raise UsageError(f"--a2a-latency must be a finite number >= 0; got {latency:g}")
    if latency is not None and not derives_a2a(args):
        raise UsageError(f"--a2a-latency {latency:g} is part of the --a2a derived from --moe-tokens, --hidden-size, "
                         "--moe-top-k, --ep and --a2a-bandwidth; give those too, or fold it into --a2a")
    if derives_a2a(args):
        missing = [opt for opt, k in DERIVE if getattr(args, k, None) is None]
        if missing:
            raise UsageError(f"deriving --a2a needs {', '.join(o for o, _ in DERIVE)} together; missing "
                             f"{', '.join(missing)}")
        if a2a is not None:
            raise UsageError("give either --a2a (a time) or --moe-tokens and the rest (derived), not both")
        experts = args.ep if getattr(args, "moe_experts", None) is None else args.moe_experts
        if experts % args.ep:
            raise UsageError(f"--moe-experts {experts} must be a multiple of --ep {args.ep} (the experts are "
                             "sharded evenly over the group)")
        a2a = expert_all_to_all(args.moe_tokens, args.hidden_size, args.moe_top_k, args.ep, experts // args.ep,
                                bandwidth=args.a2a_bandwidth, latency=latency or 0.0,
                                layers=getattr(args, "layers_per_stage", 1.0))
    if a2a is None and a2a_b is None:
        return costs
    return replace(costs, a2a=0.0 if a2a is None else a2a, a2a_b=a2a_b)
