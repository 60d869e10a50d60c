"""Simulate a schedule against a cost model: the test oracle for everything else."""

from __future__ import annotations

from .costs import Costs
from .actions import HOST_KINDS, Pair
from .engine import Engine, Stuck
from .all_to_all import Comm, comm_lanes
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
    sc = costs.resolve(schedule.stages, schedule.microbatches, slices=schedule.slices)
    if check:
        check_structure(schedule)
    try:
        played = Engine(schedule, sc).play()
    except Stuck as stuck:
        raise ScheduleError(describe_deadlock(schedule, stuck)) from None
    starts, ends = played.starts, played.ends
    return timeline(schedule, costs, sc, starts, ends, comm_lanes(schedule, sc, starts, ends),
                    exposed=played.exposed)


def timeline(schedule: Schedule, costs: Costs, sc, starts, ends, comm, exposed=None, **meta) -> Timeline:
    """The ``Timeline`` of a play of ``schedule``: the compute ops' times per rank, the transfers' lanes
    (``comm``; with memory actions the host link's OFFLOADs and RELOADs join them, ``exposed`` their waited
    time, aligned with the programs) and ``meta`` beside the costs (a lowered play's lowering and times)."""
    cap = costs.cap
    if schedule.memory_actions:
        comm = host_lanes(schedule, starts, ends, exposed, comm)
    return Timeline(
        schedule=schedule, starts=tuple(map(tuple, starts)), ends=tuple(map(tuple, ends)),
        activation=tuple(sc.activation), activation_bytes=tuple(sc.activation_bytes) if sc.activation_bytes else None,
        kept=tuple(sc.kept) if sc.kept is not None else None,
        kept_bytes=tuple(sc.kept_bytes) if sc.kept_bytes is not None else None,
        free_at_i=sc.free_at_i, mb_activation=sc.mb_activation, kv_share=sc.kv_share,
        cap=tuple(cap.per_rank(schedule.ranks)) if cap is not None else None,
        cap_unit=cap.unit if cap is not None else "chunks", comm=comm, meta={"costs": costs, **meta})


def host_lanes(schedule: Schedule, starts, ends, exposed, comm):
    """``comm`` (per rank, its transfers' ``Comm``s, or None) with each OFFLOAD and RELOAD as a ``Comm`` of its
    kind on its rank's lane: the host link, beside compute; exposed what a backward waited for it."""
    out = []
    for r, prog in enumerate(schedule.programs):
        mine = [Comm(k, op, starts[r][k], ends[r][k], exposed[r][k] if exposed is not None else 0.0, op.kind)
                for k, op in enumerate(prog) if type(op) is not Pair and op.kind in HOST_KINDS]
        lane = list(comm[r]) if comm is not None else []
        out.append(tuple(sorted(lane + mine, key=lambda c: (c.start, c.end))))
    return tuple(out)


def run(schedule: Schedule, costs: Costs | None = None) -> tuple[Timeline, Metrics]:
    """Simulate and compute metrics in one call."""
    tl = simulate(schedule, costs)
    return tl, metrics(tl)
