"""One result object per simulated schedule: what `--json` prints and tables show."""

from __future__ import annotations

import math

from .costs import CostError, Costs
from .formulas import bubble_fraction as formula_bubble
from .schedule import Schedule
from .simulate import simulate
from .timeline import Metrics, Timeline, metrics


def result(schedule: Schedule, costs: Costs, timeline: Timeline | None = None) -> dict:
    """Simulate (unless a timeline is given) and return the JSON result object."""
    tl = timeline or simulate(schedule, costs, check=True)
    mt: Metrics = metrics(tl)
    if not math.isfinite(mt.makespan):  # finite costs whose sum overflows (--tf 1e308)
        raise CostError(f"the costs overflow: the makespan is {mt.makespan}; give --tf, --tb and the other "
                        "times in a larger unit (smaller numbers)")
    formula = formula_bubble(schedule.name, schedule.ranks, schedule.microbatches, schedule.chunks, costs)
    return {
        "schedule": schedule.name,
        "ranks": schedule.ranks,
        "microbatches": schedule.microbatches,
        "chunks": schedule.chunks,
        "stages": schedule.stages,
        "actions": schedule.num_compute_actions,
        "formula_bubble_fraction": formula,
        **mt.to_dict(),
        "parameter_copies": [x * schedule.ranks for x in mt.param_share],
    }


def table(results: list[dict]) -> str:
    """A plain-text table of results, one row per schedule."""
    head = f"{'schedule':<18} {'p':>3} {'m':>4} {'v':>2} {'makespan':>9} {'bubble':>7} {'formula':>7}  peak activations per rank"
    lines = [head, "-" * len(head)]
    for r in results:
        formula = f"{r['formula_bubble_fraction']:.1%}" if r["formula_bubble_fraction"] is not None else "-"
        peaks = " ".join(f"{x:g}" for x in r["peak_activations"])
        lines.append(
            f"{r['schedule']:<18} {r['ranks']:>3} {r['microbatches']:>4} {r['chunks']:>2} "
            f"{r['makespan']:>9.4g} {r['bubble_fraction']:>7.1%} {formula:>7}  {peaks}"
        )
    return "\n".join(lines)
