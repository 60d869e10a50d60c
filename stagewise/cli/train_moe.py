"""`stagewise train`'s mixture-of-experts and expert-parallel options, and what it reports of them.

Not a subcommand: ``train.py`` adds these options. The words are the simulator's (cli/expert_options.py): ``--moe-experts``,
``--moe-top-k``, ``--ep``.
"""

from __future__ import annotations

import dataclasses

from .common import UsageError, finite_float, positive_int, whole_int
from ..flags import add_layout_options

#: the options that shape the built-in GPT's MoE blocks (argparse name -> GPTConfig field)
SHAPE = {"moe_experts": "moe_experts", "moe_top_k": "moe_top_k", "moe_shared": "moe_shared",
         "moe_capacity": "moe_capacity", "moe_pad": "moe_pad", "moe_aux": "moe_aux"}


def add_args(p) -> None:
    g = p.add_argument_group(
        "mixture of experts and expert parallel (the built-in GPT): each block's MLP a top-k routed mixture of "
        "experts; --ep shards the experts over ranks that take different rows, tokens moved by all-to-all; "
        "an F&B pair (dualpipe, dualpipe-v) runs one micro-batch's all-to-all while the other computes")
    g.add_argument("--moe-experts", type=positive_int, metavar="E", default=None,
                   help="routed experts of every block (default: the dense MLP); a multiple of --ep")
    g.add_argument("--moe-top-k", type=positive_int, metavar="K", default=None,
                   help="experts each token is routed to, default 2")
    g.add_argument("--moe-shared", type=whole_int, metavar="N", default=None,
                   help="shared experts every token goes through as well, default 0")
    g.add_argument("--moe-capacity", type=finite_float, metavar="C", default=None,
                   help="tokens an expert takes from a sequence, as a multiple of its fair share (seq x top-k / "
                   "experts); the rest are dropped for that expert; default: dropless")
    g.add_argument("--moe-pad", action="store_true",
                   help="fixed-size expert buffers: pad every expert's tokens to its capacity (needs --moe-capacity)")
    g.add_argument("--moe-aux", type=finite_float, metavar="COEF", default=None,
                   help="coefficient of the load-balancing loss added to the loss (per sequence), default 0.01")
    add_layout_options(g, ("ep",), defaults=True, more={"ep": "default 1: p x dp x ep ranks"})
    g.add_argument("--no-overlap", action="store_true",
                   help="run an F&B pair's forward, then its backward (default: interleaved at the all-to-alls)")


def apply(cfg, args):
    """``cfg`` with the options above: the GPT's MoE shape, ``ep`` and ``overlap``."""
    given = {field: getattr(args, arg) for arg, field in SHAPE.items()
             if getattr(args, arg) is not None and getattr(args, arg) is not False}
    if args.hf:
        from ..parallelism import Parallelism

        why = Parallelism(ep=args.ep).unsupported_by_hf()
        if why:
            raise UsageError(why)  # said in the CLI's words (flags.say)
    if args.hf and given:
        raise UsageError(f"--{next(iter(given)).replace('_', '-')} shapes the built-in GPT's MoE blocks; an --hf "
                         "model brings its own experts")
    if given and "moe_experts" not in given:
        raise UsageError(f"--{next(iter(given)).replace('_', '-')} shapes MoE blocks: give --moe-experts E too")
    model = dataclasses.replace(cfg.model, **given) if given else cfg.model
    return dataclasses.replace(cfg, model=model, overlap=not args.no_overlap)  # --ep: train_scale's layout


def lines(res) -> list[str]:
    """The expert-parallel layout of a run (a ``RunResult``), one line."""
    if (res.ep or 1) <= 1:
        return []
    return [f"expert parallel: {res.ep} ranks per pipeline rank share each MoE block's experts "
            f"({res.ranks * (res.dp or 1) * res.ep} ranks), tokens dispatched and combined by all-to-all"]
