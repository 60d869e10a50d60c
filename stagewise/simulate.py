"""Simulate a schedule against a cost model: the test oracle for everything else."""

from __future__ import annotations

from .costs import Costs
from .engine import Stuck, play
from .all_to_all import comm_lanes
from .schedule import Schedule
from .timeline import Metrics, Timeline, metrics
from .validate import ScheduleError, check_structure, describe_deadlock


def simulate(schedule: Schedule, costs: Costs | None = None, *, check: bool = True) -> Timeline:
    """Timeline of ``schedule`` under ``costs`` (default ``t_f=1, t_b=2``).

    With ``costs.comm`` (``lowering.Communication``, which the core does not import) the schedule is lowered and
    the engine plays the lowered programs (``Communication.simulate``), else the schedule's own (``engine.play``). Raises ``ScheduleError`` for an
    invalid or deadlocking schedule.
    """
    costs = costs or Costs()
    if costs.comm is not None:  # communication as actions: the lowered programs, transfers on their resources
        return costs.comm.simulate(schedule, costs, check=check)
    sc = costs.resolve(schedule.stages, schedule.slices)
    if check:
        check_structure(schedule)
    try:
        starts, ends = play(schedule, sc)
    except Stuck as stuck:
        raise ScheduleError(describe_deadlock(schedule, stuck)) from None
    return timeline(schedule, costs, sc, starts, ends, comm_lanes(schedule, sc, starts, ends))


def timeline(schedule: Schedule, costs: Costs, sc, starts, ends, comm, **meta) -> Timeline:
    """The ``Timeline`` of a play of ``schedule``: the compute ops' times per rank, the transfers' lanes
    (``comm``) and ``meta`` beside the costs (a lowered play's lowering and times)."""
    cap = costs.cap
    return Timeline(
        schedule=schedule, starts=tuple(map(tuple, starts)), ends=tuple(map(tuple, ends)),
        activation=tuple(sc.activation), activation_bytes=tuple(sc.activation_bytes) if sc.activation_bytes else None,
        free_at_i=sc.free_at_i, kv_share=sc.kv_share, cap=tuple(cap.per_rank(schedule.ranks)) if cap is not None else None,
        cap_unit=cap.unit if cap is not None else "chunks", comm=comm, meta={"costs": costs, **meta})


def run(schedule: Schedule, costs: Costs | None = None) -> tuple[Timeline, Metrics]:
    """Simulate and compute metrics in one call."""
    tl = simulate(schedule, costs)
    return tl, metrics(tl)
