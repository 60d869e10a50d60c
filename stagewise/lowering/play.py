"""Play a lowered schedule: compute on each rank's compute stream, communication on its own resources.

The engine (``engine.Engine``) plays the lowered programs, as it plays a compute-only schedule: its module
docstring says how sends, receives, collectives and the all-to-all take their time. Here is what a lowered
play adds around it: the all-to-all's time from the lowering's bytes, the transfers as a timeline's lanes,
and the step's span the planner asks for. With every transfer free the compute times are ``engine.play``'s
exactly.
"""

from __future__ import annotations

from itertools import compress
from operator import itemgetter

from ..actions import new
from ..costs import Costs, StageCosts
from ..engine import Engine, Played, Stuck
from ..all_to_all import Comm, comm_lanes
from ..collector import gc_paused
from ..comm_actions import ALL_TO_ALL, CommAction
from .lower import Lowered


def a2a_costs(low: Lowered, costs: Costs) -> Costs:
    """``costs`` with the all-to-all time from the lowering's bytes and network, where it gives bytes."""
    from dataclasses import replace

    sizes = low.options.sizes.resolve(low.schedule.stages)
    if low.parallelism.ep < 2 or not any(sizes["a2a"]):
        return costs
    ranks = low.global_ranks(0, "ep")
    inside = low.inside(ranks)
    t = [low.options.network.collective("all-to-all", 2 * b, low.parallelism.ep, inside) for b in sizes["a2a"]]
    return replace(costs, a2a=t, a2a_b=None)


def play_lowered(low: Lowered, sc: StageCosts, costs: Costs) -> Played:
    """Times of every action of ``low`` (``engine.Engine``). Raises ``engine.Stuck`` on a deadlock."""
    return Engine(low.schedule, sc, low, costs.latency, costs.bandwidth).play()


def lanes(low: Lowered, played: Played, sc: StageCosts, compute_starts, compute_ends):
    """Per rank, the ``all_to_all.Comm`` of every transfer with a duration (the all-to-alls as ``all_to_all`` lays
    them out), kind set; None when there is none."""
    a2a = comm_lanes(low.schedule, sc, compute_starts, compute_ends)
    out, anything = [], False
    for r, prog in enumerate(low.programs):
        lane = list(a2a[r]) if a2a is not None else []
        st, en, ex = played.starts[r], played.ends[r], played.exposed[r]
        comms = [(k, a) for k, a in enumerate(prog) if type(a) is CommAction]
        # the j-th transfer at position k comes after k - j compute ops: it belongs to the last of them
        lane += [new(Comm, (k - j - 1 if k > j else 0, a, st[k], en[k], ex[k], a.kind))
                 for j, (k, a) in enumerate(comms) if a.kind != ALL_TO_ALL and (en[k] > st[k] or ex[k] > 0)]
        anything = anything or bool(lane)
        out.append(tuple(sorted(lane, key=_start_end)))
    return tuple(out) if anything else None


_start_end = itemgetter(2, 3)  #: a ``Comm``'s (start, end)


def compute_times(low: Lowered, played: Played):
    """The compute ops' (starts, ends) per rank, aligned with the schedule's programs."""
    starts, ends = [], []
    for r, prog in enumerate(low.programs):
        ops = [type(a) is not CommAction for a in prog]
        starts.append(list(compress(played.starts[r], ops)))
        ends.append(list(compress(played.ends[r], ops)))
    return starts, ends


def step_span(low: Lowered, costs: Costs) -> tuple[float, dict[str, float]]:
    """(the step's span, transfers included, and per kind of transfer the most seconds one rank waited on it)
    of a valid lowered schedule: ``simulate_lowered``'s ``finish - origin`` and ``Metrics.comm``'s worst
    exposed time without building the timeline (the planner asks it of every configuration it lowers)."""
    costs = a2a_costs(low, costs)
    played = play_lowered(low, costs.resolve(low.schedule.stages, low.schedule.slices), costs)
    origin = min(min(st) for st in played.starts if st)
    finish = max(max(en) for en in played.ends if en)
    worst: dict[str, float] = {}
    for prog, ex in zip(low.programs, played.exposed):
        mine: dict[str, float] = {}
        for a, x in zip(prog, ex):
            if x:
                mine[a.kind] = mine.get(a.kind, 0.0) + x
        for kind, x in mine.items():
            worst[kind] = max(worst.get(kind, 0.0), x)
    return finish - origin, worst


def simulate_lowered(low: Lowered, costs: Costs | None = None, *, check: bool = True):
    """The ``Timeline`` of a lowered schedule under ``costs``: the compute ops' times (``engine.play``'s when
    every transfer is free), ``comm`` every transfer with a duration, ``meta["lowered"]`` the lowering and
    ``meta["played"]`` the times of all its actions. Raises ``ScheduleError`` for an invalid schedule or a
    deadlock."""
    from ..simulate import timeline
    from ..validate import ScheduleError, check_structure
    from .stuck import describe_stuck

    costs = a2a_costs(low, costs or Costs())
    sched = low.schedule
    sc = costs.resolve(sched.stages, sched.slices)
    if check:
        check_structure(sched)
    try:
        played = play_lowered(low, sc, costs)
    except Stuck as stuck:
        raise ScheduleError(describe_stuck(low, stuck)) from None
    with gc_paused():  # a tuple per transfer and no cycles
        starts, ends = compute_times(low, played)
        comm = lanes(low, played, sc, starts, ends)
    return timeline(sched, costs, sc, starts, ends, comm, lowered=low, played=played)


__all__ = ["simulate_lowered", "step_span", "Played", "a2a_costs", "compute_times", "lanes", "play_lowered"]
