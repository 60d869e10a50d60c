"""The communication options (`simulate`, `compare`, `draw`, `explain`): the layout around the pipeline, the
model's sizes in bytes, the network and a framework's overlap rule. Any of them lowers the schedule
(communication as actions, stagewise.lowering) and the simulator plays the lowered programs."""

from __future__ import annotations

import argparse

from ..costs import Costs
from ..parallelism import Parallelism
from .values import finite_float, per_stage_value, positive_int

#: Parallelism fields offered here (pp is -p; ep is the all-to-all group's --ep)
_DEGREES = ("dp", "fsdp", "tp", "zero", "reshard_after_forward")


def add_comm_args(p: argparse.ArgumentParser) -> None:
    from ..lowering import FRAMEWORKS

    g = p.add_argument_group("communication as actions (any of these lowers the schedule: sends, receives, "
                             "gathers, reductions, ties and step-end collectives on their own resources)")
    for f in Parallelism.options():
        if f.name not in _DEGREES:
            continue
        if f.type in (bool, "bool"):
            g.add_argument(f.metadata["flag"], action="store_true", default=None, help=f.metadata["help"])
        elif f.name == "zero":
            g.add_argument(f.metadata["flag"], type=int, choices=(0, 1), default=None, help=f.metadata["help"])
        else:
            g.add_argument(f.metadata["flag"], type=positive_int, default=None, help=f.metadata["help"])
    g.add_argument("--comms", action="store_true", help="lower the schedule even with no other option here "
                   "(sends and receives as actions)")
    g.add_argument("--framework", choices=tuple(FRAMEWORKS), default=None,
                   help="whose overlap rule places the reductions and gathers (default stagewise)")
    g.add_argument("--param-bytes", type=per_stage_value, default=None, metavar="B[,B..]",
                   help="bytes of one stage's parameters (per tensor-parallel rank, unsharded)")
    g.add_argument("--grad-bytes", type=per_stage_value, default=None, metavar="B[,B..]",
                   help="bytes of one stage's gradients as reduced (default --param-bytes)")
    g.add_argument("--tie-bytes", type=finite_float, default=None, metavar="B",
                   help="bytes of a tied embedding and head (their gradients all-reduced at step end)")
    g.add_argument("--moe-bytes", type=per_stage_value, default=None, metavar="B[,B..]",
                   help="one forward's all-to-all dispatch bytes per stage (with --ep; --a2a gives times instead)")
    g.add_argument("--gpus-per-node", type=positive_int, default=8, help="ranks per node, default 8")
    g.add_argument("--intra-bandwidth", type=finite_float, default=None, metavar="BYTES",
                   help="collective bytes per time unit inside a node (default: free)")
    g.add_argument("--inter-bandwidth", type=finite_float, default=None, metavar="BYTES",
                   help="collective bytes per time unit across nodes (default: free)")
    g.add_argument("--intra-latency", type=finite_float, default=0.0, help="one collective step inside a node")
    g.add_argument("--inter-latency", type=finite_float, default=0.0, help="one collective step across nodes")


def comm_costs(args: argparse.Namespace, costs: Costs) -> Costs:
    """``costs`` with ``comm`` set when any communication option is given."""
    from dataclasses import replace

    from ..lowering import FRAMEWORKS, Communication, LoweringOptions, Network, Sizes

    degrees = {n: getattr(args, n, None) for n in _DEGREES}
    given = [n for n, x in degrees.items() if x not in (None, 0, False, 1)] + [
        n for n in ("param_bytes", "grad_bytes", "tie_bytes", "moe_bytes", "framework", "intra_bandwidth",
                    "inter_bandwidth") if getattr(args, n, None) is not None]
    if not given and not getattr(args, "comms", False):
        return costs
    par = Parallelism(ep=getattr(args, "ep", None) or 1,
                      **{n: (bool(x) if n == "reshard_after_forward" else x) for n, x in degrees.items()
                         if x is not None})
    par.check()
    sizes = Sizes(params=args.param_bytes or 0.0, grads=args.grad_bytes, tie=args.tie_bytes or 0.0,
                  a2a=args.moe_bytes or 0.0)
    net = Network(gpus_per_node=args.gpus_per_node, intra_bandwidth=args.intra_bandwidth,
                  inter_bandwidth=args.inter_bandwidth, intra_latency=args.intra_latency,
                  inter_latency=args.inter_latency)
    overlap = FRAMEWORKS[args.framework or "stagewise"]
    moe = True if costs.a2a else None
    opts = LoweringOptions(overlap=overlap, sizes=sizes, network=net, moe=moe)
    return replace(costs, comm=Communication(parallelism=par, options=opts))
