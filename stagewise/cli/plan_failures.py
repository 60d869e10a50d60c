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
    state = sum(layer.param_bytes for layer in profile.layers) * max(1.0, args.state_factor - 1)
    return _cost(args, state, best.schedule.ranks, args.devices, best.step_time)


def cluster_cost(args, job, best):
    """The ``FailureCost`` of a cluster plan's recommended row (None without --failure-rate). The checkpoint
    holds the bf16 weights and the fp32 master weights and Adam's two moments (``CHECKPOINT_BYTES_PER_PARAM``);
    sharded state (zero1, fsdp, hsdp) is written by every GPU, its own share, and replicated state by one
    replica's t x p GPUs (DCP writes a replicated tensor once)."""
    if args.failure_rate is None:
        if args.checkpoint_interval is not None:
            raise UsageError("--checkpoint-interval needs --failure-rate")
        return None
    from ..plan.cluster import CHECKPOINT_BYTES_PER_PARAM

    writers = job.gpus if best.sharding != "ddp" else job.gpus // best.config.dp
    return _cost(args, job.spec.params() * CHECKPOINT_BYTES_PER_PARAM, writers, job.gpus, best.step_time)


def _cost(args, state: float, writers: int, devices: int, step_time: float):
    from ..plan.errors import PlanError
    from ..plan.failures import failure_cost
    from ..plan.search import parse_bytes

    try:
        return failure_cost(checkpoint_bytes=state, writers=writers,
                            write_bandwidth=parse_bytes(args.write_bandwidth.removesuffix("/s"), "--write-bandwidth"),
                            rate=args.failure_rate, devices=devices, step_time=step_time,
                            restart=args.restart_time, interval=args.checkpoint_interval)
    except PlanError as e:
        raise UsageError(str(e)) from None


def saving(command: str, c, step_time: float | None = None) -> str:
    """``command`` with the options that save every ``c.interval_s`` of work (before the command's comment), in
    steps of ``step_time`` (None: the costed layout's, ``c.interval_steps``)."""
    steps = c.interval_steps if step_time is None else max(1, round(c.interval_s / step_time))
    run, sep, note = command.partition("   #")
    return f"{run} --save ckpt --save-every {steps} --save-on-signal --max-restarts 3" + (sep + note if sep else "")


def lines(c) -> list[str]:
    from ..plan.failures import lines as said
    from ..plan.search import fmt_bytes

    return said(c, fmt_bytes) if c is not None else []
