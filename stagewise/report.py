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
    k = schedule.slices
    formula = formula_bubble(schedule.name, schedule.ranks, schedule.microbatches // k, schedule.chunks, costs, k)
    return {
        "schedule": schedule.name,
        "ranks": schedule.ranks,
        "microbatches": schedule.microbatches // k,
        "slices": k,
        "chunks": schedule.chunks,
        "stages": schedule.stages,
        "actions": schedule.num_compute_actions,
        "formula_bubble_fraction": formula,
        **mt.to_dict(),
        "parameter_copies": [x * schedule.ranks for x in mt.param_share],
        "memory_model": memory_model(costs, schedule.stages, k),
        **({"parallelism": tl.meta["lowered"].parallelism.to_dict(),
            "lowered_memory": lowered_memory(tl.meta["lowered"], costs)} if "lowered" in tl.meta else {}),
    }


def lowered_memory(low, costs: Costs) -> dict:
    """What each rank of a lowered run holds at its peak, in bytes, by kind (``lowering.rank_memory``): activations
    where their bytes are given (else none are counted: ``activations_in_bytes`` false), gathered weights,
    unsharded gradients, received buffers."""
    from .costs import per_stage
    from .lowering.rank_memory import lowered_memory as walk

    S = low.schedule.stages
    sc = costs.resolve(S)
    act = sc.activation_bytes or [0.0] * S
    ranks = walk(low, act, sc.free_at_i, boundary=per_stage("boundary_bytes", costs.boundary_bytes, S))
    return {"activations_in_bytes": sc.activation_bytes is not None, "peak": [m.peak.total for m in ranks],
            "parts": [m.peak._asdict() for m in ranks], "at": [m.at for m in ranks]}


def lowered_memory_line(res: dict) -> str | None:
    """The fullest rank of a lowered run and what it holds at its peak (None: not lowered)."""
    got = res.get("lowered_memory")
    if not got:
        return None
    r = max(range(len(got["peak"])), key=got["peak"].__getitem__)
    counted = got["activations_in_bytes"]
    parts = ", ".join(f"{k} {v:.4g}" for k, v in got["parts"][r].items() if counted or k != "activations")
    note = "" if counted else " (activations not counted: give --activation-bytes or --hidden-size)"
    return f"{res['schedule']}: lowered memory peak {got['peak'][r]:.4g} bytes on rank {r}: {parts}{note}"


def memory_model(costs: Costs, stages: int, slices: int = 1) -> dict:
    """What each action kind adds to its rank's live activations, per stage (negative: frees); with sequence
    slices, per slice j of a micro-batch too (``by_slice``: unit -> kind -> per stage)."""
    sc = costs.resolve(stages, slices)
    units = {"chunks": False, "bytes": True} if sc.activation_bytes else {"chunks": False}
    out = {u: {k: [sc.allocated(k, s, b) for s in range(stages)] for k in "FBIW"} for u, b in units.items()}
    if slices > 1:
        out["by_slice"] = [{u: {k: [sc.allocated(k, s, b, j) for s in range(stages)] for k in "FBIW"}
                            for u, b in units.items()} for j in range(slices)]
    return {"free_at_i": sc.free_at_i, **out}


def memory_line(res: dict) -> str | None:
    """One line on peak memory against the cap (None without a cap)."""
    if res.get("memory_cap") is None:
        return None
    unit = res["cap_unit"]
    peaks = res["peak_activation_bytes"] if unit == "bytes" else res["peak_activations"]
    over = [r for r, (x, c) in enumerate(zip(peaks, res["memory_cap"])) if x > c * (1 + 1e-9)]
    verdict = "within the cap" if not over else f"over the cap on rank{'s' if len(over) > 1 else ''} " + \
        ", ".join(map(str, over))
    fmt = (lambda x: f"{x:.4g}") if unit == "bytes" else (lambda x: f"{x:g}")
    return (f"{res['schedule']}: peak {'bytes' if unit == 'bytes' else 'chunk-units'} per rank {' '.join(map(fmt, peaks))}; cap "
            f"{' '.join(map(fmt, res['memory_cap']))}: {verdict}")


def comm_line(res: dict) -> str | None:
    """The lowered communication of a result, per kind: time and exposed time summed over ranks (None: not
    lowered). 'REDUCE_GRAD 4 (exposed 1), UNSHARD 4 (exposed 1)'."""
    comm = res.get("comm")
    if not comm:
        return None
    parts = [f"{k} {sum(v['time']):.4g} (exposed {sum(v['exposed']):.4g})" for k, v in comm.items()]
    return f"{res['schedule']}: communication over all ranks: " + ", ".join(parts)


def a2a_cells(res: dict) -> tuple[str, str]:
    """(exposed all-to-all of the busiest rank, share of all all-to-all hidden) as table text."""
    total = sum(res["a2a"])
    if not total:
        return "-", "-"
    return f"{max(res['exposed_a2a']):.4g}", f"{sum(res['hidden_a2a']) / total:.0%}"


def table(results: list[dict]) -> str:
    """A plain-text table of results, one row per schedule (all-to-all columns when there is any)."""
    comm = any(sum(r.get("a2a") or ()) for r in results)
    extra = f" {'exp a2a':>8} {'hidden':>6}" if comm else ""
    head = (f"{'schedule':<18} {'p':>3} {'m':>4} {'v':>2} {'makespan':>9} {'bubble':>7} {'formula':>7}{extra}  "
            "peak activations per rank")
    lines = [head, "-" * len(head)]
    for r in results:
        formula = f"{r['formula_bubble_fraction']:.1%}" if r["formula_bubble_fraction"] is not None else "-"
        peaks = " ".join(f"{x:g}" for x in r["peak_activations"])
        exposed, hidden = a2a_cells(r)
        cells = f" {exposed:>8} {hidden:>6}" if comm else ""
        name = r["schedule"] + (f" k={r['slices']}" if r.get("slices", 1) > 1 else "")
        lines.append(
            f"{name:<18} {r['ranks']:>3} {r['microbatches']:>4} {r['chunks']:>2} "
            f"{r['makespan']:>9.4g} {r['bubble_fraction']:>7.1%} {formula:>7}{cells}  {peaks}"
        )
    if comm:
        lines += ["", "exp a2a: all-to-all the busiest rank waits for (not hidden behind compute); hidden: share of "
                  "all all-to-all that ran while the rank computed"]
    caps = [line for r in results if (line := memory_line(r))]
    return "\n".join(lines + ([""] + caps if caps else []))
