"""`stagewise plan --failure-rate`: what the recommended layout costs under faults, and the checkpoint interval
to take (``stagewise.plan.failures``: Young/Daly). Not a subcommand: plan.py adds these options and prints this.
"""

from __future__ import annotations

from .common import UsageError, finite_float


def add_options(p) -> None:
    g = p.add_argument_group("under faults")
    g.add_argument("--failure-rate", type=finite_float, default=None, metavar="F",
                   help="failures per device per day: show the work a failure loses at --checkpoint-interval and "
                   "suggest an interval (Young/Daly)")
    g.add_argument("--checkpoint-interval", type=finite_float, default=None, metavar="S",
                   help="seconds of work between checkpoints (default: the suggested one)")
    g.add_argument("--write-bandwidth", default="1GB/s", metavar="BYTES/S",
                   help="checkpoint write bandwidth of each writing rank, default 1GB/s (a stated assumption)")
    g.add_argument("--restart-time", type=finite_float, default=60.0, metavar="S",
                   help="seconds from a failure to training again (detection, restart, load), default 60")


def cost(args, profile, best):
    """The ``FailureCost`` of the winner (None without --failure-rate). The checkpoint holds the model's
    weights and optimizer state: its parameter bytes x (--state-factor - 1, the gradients are not saved),
    written by the p ranks of a pipeline in parallel (DCP writes a replica's copy once)."""
    if args.failure_rate is None:
        if args.checkpoint_interval is not None:
            raise UsageError("--checkpoint-interval needs --failure-rate")
        return None
    from ..plan.errors import PlanError
    from ..plan.failures import failure_cost
    from ..plan.search import parse_bytes

    state = sum(layer.param_bytes for layer in profile.layers) * max(1.0, args.state_factor - 1)
    try:
        return failure_cost(checkpoint_bytes=state, writers=best.schedule.ranks,
                            write_bandwidth=parse_bytes(args.write_bandwidth.removesuffix("/s"), "--write-bandwidth"),
                            rate=args.failure_rate, devices=args.devices, step_time=best.step_time,
                            restart=args.restart_time, interval=args.checkpoint_interval)
    except PlanError as e:
        raise UsageError(str(e)) from None


def lines(c) -> list[str]:
    from ..plan.failures import lines as said
    from ..plan.search import fmt_bytes

    return said(c, fmt_bytes) if c is not None else []
