"""The communication options (`simulate`, `compare`, `draw`, `explain`): the layout around the pipeline, the
model's sizes in bytes, the network and a framework's overlap rule. Any of them lowers the schedule
(communication as actions, stagewise.lowering) and the simulator plays the lowered programs."""

from __future__ import annotations

import argparse

from ..costs import Costs
from ..parallelism import Parallelism
from ..flags import add_layout_options
from ..option_values import finite_float, per_stage_value, positive_int

#: Parallelism fields offered here (pp is -p; ep is the all-to-all group's --ep)
_DEGREES = ("dp", "fsdp", "tp", "zero", "reshard_after_forward")


def add_comm_args(p: argparse.ArgumentParser) -> None:
    g = add_layout_args(p)
    g.add_argument("--comms", action="store_true", help="lower the schedule even with no other option here "
                   "(sends and receives as actions)")
    g.add_argument("--gpus-per-node", type=positive_int, default=8, help="ranks per node, default 8")
    g.add_argument("--intra-bandwidth", type=finite_float, default=None, metavar="BYTES",
                   help="collective bytes per time unit inside a node (default: free)")
    g.add_argument("--inter-bandwidth", type=finite_float, default=None, metavar="BYTES",
                   help="collective bytes per time unit across nodes (default: free)")
    g.add_argument("--intra-latency", type=finite_float, default=0.0, help="one collective step inside a node")
    g.add_argument("--inter-latency", type=finite_float, default=0.0, help="one collective step across nodes")


class FrameworkNames:
    """``lowering.FRAMEWORKS``'s names, read only when argparse checks a value or prints help: building a parser
    does not import the lowering (a third of ``stagewise simulate``'s start-up)."""

    def __iter__(self):
        from ..lowering import FRAMEWORKS

        return iter(FRAMEWORKS)  # (``in`` iterates too)


def add_layout_args(p: argparse.ArgumentParser):
    """The degrees, the overlap rule and the sizes (what ``export --comms`` takes too)."""
    g = p.add_argument_group("communication as actions (any of these lowers the schedule: sends, receives, "
                             "gathers, reductions, ties and step-end collectives on their own resources)")
    add_layout_options(g, _DEGREES)
    g.add_argument("--framework", choices=FrameworkNames(), default=None, metavar="NAME",
                   help="whose overlap rule places the reductions and gathers: %(choices)s (default stagewise)")
    g.add_argument("--param-bytes", type=per_stage_value, default=None, metavar="B[,B..]",
                   help="bytes of one stage's parameters (per tensor-parallel rank, unsharded)")
    g.add_argument("--grad-bytes", type=per_stage_value, default=None, metavar="B[,B..]",
                   help="bytes of one stage's gradients as reduced (default --param-bytes)")
    g.add_argument("--tie-bytes", type=finite_float, default=None, metavar="B",
                   help="bytes of a tied embedding and head (their gradients all-reduced at step end)")
    g.add_argument("--moe-bytes", type=per_stage_value, default=None, metavar="B[,B..]",
                   help="one forward's all-to-all dispatch bytes per stage (with --ep; --a2a gives times instead)")
    return g


def comm_costs(args: argparse.Namespace, costs: Costs) -> Costs:
    """``costs`` with ``comm`` set when any communication option is given (or the --csv had communication)."""
    from dataclasses import replace

    comm = communication(args, moe=True if costs.a2a else None)
    return costs if comm is None else replace(costs, comm=comm)


def communication(args: argparse.Namespace, *, force: bool = False, moe: bool | None = None):
    """The ``lowering.Communication`` the options describe; None when none is given (unless ``force``)."""
    from dataclasses import replace

    degrees = {n: getattr(args, n, None) for n in _DEGREES}
    given = [n for n, x in degrees.items() if x is True or (type(x) is int and x > 1)] + [
        n for n in ("param_bytes", "grad_bytes", "tie_bytes", "moe_bytes", "framework", "intra_bandwidth",
                    "inter_bandwidth") if getattr(args, n, None) is not None]
    low = getattr(args, "lowered", None)
    if not given and not getattr(args, "comms", False) and not force and low is None:
        return None
    from ..lowering import FRAMEWORKS, Communication, LoweringOptions, Network, Sizes  # only when lowering

    par = Parallelism(**{n: x for n, x in {**degrees, "ep": getattr(args, "ep", None)}.items() if x is not None})
    par.check()
    # with a link bandwidth the boundary's bytes occupy each link, so back-to-back sends queue on it
    boundary = args.boundary_bytes if getattr(args, "bandwidth", None) else None
    sizes = Sizes(params=args.param_bytes or 0.0, grads=args.grad_bytes, tie=args.tie_bytes or 0.0,
                  a2a=args.moe_bytes or 0.0, boundary=boundary)
    net = Network(**{k: getattr(args, k) for k in ("gpus_per_node", "intra_bandwidth", "inter_bandwidth",
                                                   "intra_latency", "inter_latency") if hasattr(args, k)})
    overlap = FRAMEWORKS[args.framework or "stagewise"]
    opts = LoweringOptions(overlap=overlap, sizes=sizes, network=net, moe=moe)
    comm = Communication(parallelism=par, options=opts)
    if low is not None:  # a compute+comms CSV: its programs, played with these options
        par = replace(par, pp=low.schedule.ranks)
        comm = replace(comm, given=replace(low, parallelism=par, options=opts,
                                           programs=_regrouped(low, par, opts)))
    return comm


def _regrouped(low, par: Parallelism, opts):
    """A read CSV's gathers and reductions over the layout's group, with the sizes' bytes (the file says
    neither)."""
    from ..comm_actions import P2P, RESHARD, UNSHARD, REDUCE_GRAD, CommAction
    from ..lowering.lower import gradient_reduction

    sizes = opts.sizes.resolve(low.schedule.stages)
    group, stream, reduce_op = gradient_reduction(par)
    out = []
    for prog in low.programs:
        row = []
        for a in prog:
            if type(a) is CommAction and a.kind in (UNSHARD, RESHARD, REDUCE_GRAD):
                nbytes = {UNSHARD: sizes["params"][a.stage], REDUCE_GRAD: sizes["grads"][a.stage]}.get(a.kind, 0.0)
                a = a._replace(group=group if a.kind == REDUCE_GRAD else stream, stream=stream, nbytes=nbytes,
                               op=reduce_op if a.kind == REDUCE_GRAD else a.op)
            elif type(a) is CommAction and a.kind in P2P and sizes["boundary"] is not None:
                d, s, _ = a.key
                a = a._replace(nbytes=sizes["boundary"][s - 1 if d == "F" else s])
            row.append(a)
        out.append(tuple(row))
    return tuple(out)
