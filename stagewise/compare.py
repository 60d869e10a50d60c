"""Several families at the same p, m (v where a family takes it) and costs: the one comparison.

The CLI's ``compare`` and ``demo``, the notebook's ``compare`` and the
workshop all call these, so a family is picked, generated and simulated the
same way everywhere.

>>> [e.result["schedule"] for e in compare(["1f1b", "zb-h1"], 4, 8)]
['1f1b', 'zb-h1']
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence, Union

from .costs import Costs
from .limits import COMPARE_ACTIONS, Limit
from .report import result
from .schedule import Schedule
from .schedules.registry import FAMILIES, ScheduleArgError, family, generate
from .simulate import simulate
from .timeline import Timeline

#: one cost model for all, or one per schedule (e.g. scaled to its stages' share of the model)
CostsFor = Union[Costs, Callable[[Schedule], Costs], None]


class Entry(NamedTuple):
    """One family's simulated timeline and its JSON result (``report.result``)."""

    timeline: Timeline
    result: dict


def schedules_for(names: Sequence[str] | None, ranks: int, microbatches: int, chunks: int | None = None,
                  limit: Limit | None = COMPARE_ACTIONS, slices: int = 1) -> list[Schedule]:
    """The schedule of each named family; ``chunks`` and ``slices`` only go to the families that take them.

    ``names=None`` means every family, skipping those that do not accept p and m; a named family that
    does not raises ``ScheduleArgError`` naming the option and its rule. Every timeline is kept, so the
    actions of all families together are bounded by ``limit`` (``LimitError`` at the first too many).
    """
    out, total = [], 0
    for name in names if names is not None else FAMILIES:
        fam = family(name.strip())
        v = chunks if chunks and (fam.chunks is None or chunks in fam.chunks) else None
        try:
            sched = generate(fam.name, ranks, microbatches, v, slices if fam.slices else 1)
        except ScheduleArgError:
            if names is not None:
                raise
            continue
        total += sched.num_actions
        if limit is not None:
            limit.check(total, "", detail=f"-p {ranks} -m {microbatches}: the first {len(out) + 1} families "
                        f"make {total} actions (compare fewer: --schedules)")
        out.append(sched)
    return out


def simulate_all(schedules: Sequence[Schedule], costs: CostsFor = None) -> list[Entry]:
    """Simulate each schedule under its costs."""
    out = []
    for sched in schedules:
        c = costs(sched) if callable(costs) else costs or Costs()
        tl = simulate(sched, c)
        out.append(Entry(tl, result(sched, c, tl)))
    return out


def compare(names: Sequence[str] | None, ranks: int, microbatches: int, chunks: int | None = None,
            costs: CostsFor = None, slices: int = 1) -> list[Entry]:
    """Each named family (None: all that accept p, m) simulated at the same p, m and costs (``slices`` for the
    families that cut micro-batches into sequence slices)."""
    return simulate_all(schedules_for(names, ranks, microbatches, chunks, slices=slices), costs)
