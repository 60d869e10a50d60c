"""What a layout costs under faults: the work a failure loses for a checkpoint interval, and the interval to take.

A job on N devices, each failing at ``rate`` per day, fails on average every ``M = 1 day / (rate x N)`` (its
MTBF). A checkpoint takes ``delta`` seconds to write (its bytes over the writers' bandwidth: every rank writes
its own share in parallel, a replicated tensor once) and the run blocks while it is written. With a
checkpoint every ``tau`` seconds of work, a failure loses on average half an interval and half a write, plus
the restart ``R``: ``(tau + delta) / 2 + R``; the run's overhead is ``delta / tau`` (writing) plus that loss
every ``M`` seconds. Young (1974) takes ``tau = sqrt(2 delta M)``, Daly (2006) corrects it to higher order:
``sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta`` for ``delta < 2M``, else ``M``.

No torch: the planner shows it with ``plan --failure-rate``.

Example:
    >>> c = failure_cost(checkpoint_bytes=12e9, writers=4, write_bandwidth=1e9, rate=0.01, devices=8,
    ...                  step_time=2.0, restart=60.0, interval=600.0)
    >>> round(c.write_s), round(c.mtbf_s), round(c.young_s), c.lost_per_failure_s
    (3, 1080000, 2546, 361.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import PlanError

DAY = 86400.0


class FailureError(PlanError):
    """A failure rate, bandwidth or interval that is not a positive number."""


@dataclass(frozen=True, kw_only=True)
class FailureCost:
    """One layout under faults (seconds throughout)."""

    checkpoint_bytes: float  #: the model state a checkpoint holds (weights and optimizer state)
    write_s: float  #: delta: one checkpoint's write, every writer in parallel
    mtbf_s: float  #: M: the job's mean time between failures
    restart_s: float  #: R: from a failure to training again (detection, restart, load)
    interval_s: float  #: tau: work between checkpoints (the given one, else Daly's)
    interval_steps: int  #: tau in whole steps (>= 1): the `--save-every` to give
    lost_per_failure_s: float  #: (tau + delta) / 2 + R
    overhead: float  #: of the run's time: writing (delta / tau) and failures (lost per failure / M)
    young_s: float  #: Young's interval
    daly_s: float  #: Daly's interval (the suggestion)
    daly_overhead: float  #: the overhead at Daly's interval

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def young(delta: float, mtbf: float) -> float:
    return math.sqrt(2 * delta * mtbf)


def daly(delta: float, mtbf: float) -> float:
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def overhead(interval: float, delta: float, mtbf: float, restart: float) -> float:
    """Of the run's time: the checkpoint writes and the work failures lose."""
    return delta / interval + ((interval + delta) / 2 + restart) / mtbf


def failure_cost(*, checkpoint_bytes: float, writers: int, write_bandwidth: float, rate: float, devices: int,
                 step_time: float, restart: float, interval: float | None = None) -> FailureCost:
    """The cost of failures at ``rate`` per device per day for ``devices`` devices; ``interval``: seconds of work
    between checkpoints (None: Daly's)."""
    for name, value in (("--failure-rate", rate), ("--write-bandwidth", write_bandwidth), ("step time", step_time)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise FailureError(f"{name} must be a finite number > 0; got {value!r}")
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise FailureError(f"--checkpoint-interval must be a finite number of seconds > 0; got {interval!r}")
    if not (math.isfinite(restart) and restart >= 0):
        raise FailureError(f"--restart-time must be a finite number of seconds >= 0; got {restart!r}")
    delta = checkpoint_bytes / (max(1, writers) * write_bandwidth)
    mtbf = DAY / (rate * devices)
    best = daly(delta, mtbf)
    tau = best if interval is None else interval
    return FailureCost(checkpoint_bytes=checkpoint_bytes, write_s=delta, mtbf_s=mtbf, restart_s=restart,
                       interval_s=tau, interval_steps=max(1, round(tau / step_time)),
                       lost_per_failure_s=(tau + delta) / 2 + restart, overhead=overhead(tau, delta, mtbf, restart),
                       young_s=young(delta, mtbf), daly_s=best, daly_overhead=overhead(best, delta, mtbf, restart))


def duration(x: float) -> str:
    """Seconds as a person says them: 42 s, 7.5 min, 3.2 h, 12.5 days."""
    for unit, size in (("days", DAY), ("h", 3600.0), ("min", 60.0)):
        if x >= 2 * size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.3g} s"


def lines(c: FailureCost, fmt_bytes) -> list[str]:
    """What ``plan --failure-rate`` prints."""
    fmt_seconds = duration
    return [f"under faults: a checkpoint of {fmt_bytes(c.checkpoint_bytes)} writes in {fmt_seconds(c.write_s)}; the "
            f"job fails every {fmt_seconds(c.mtbf_s)} on average (MTBF)",
            f"  every {fmt_seconds(c.interval_s)} of work (--save-every {c.interval_steps}): a failure loses "
            f"{fmt_seconds(c.lost_per_failure_s)} ((interval + write) / 2 + restart {fmt_seconds(c.restart_s)}); "
            f"overhead {c.overhead:.2%} of the run",
            f"  suggested interval: {fmt_seconds(c.daly_s)} (Daly; Young {fmt_seconds(c.young_s)}), overhead "
            f"{c.daly_overhead:.2%}"]
