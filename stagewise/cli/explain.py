"""`stagewise explain`: why each idle gap waits, one line per gap."""

from __future__ import annotations

from .memory import add_memory_action_args, placed
from .common import add_cost_args, add_schedule_args, costs_from, print_json, read_checked, schedule_from, whole_int


def register(sub) -> None:
    p = sub.add_parser("explain", help="say why each idle gap waits: the action it waits for and the first cause",
                       description="Simulate a schedule and print each idle gap in plain words, then on an "
                       "indented line in exact terms: the action that waits, the one it waits for, the chain of "
                       "waits back to the first cause (fill, drain, slow stage, link or order); and the idle time "
                       "per cause.")
    add_schedule_args(p)
    add_cost_args(p)
    add_memory_action_args(p)
    p.add_argument("--rank", type=whole_int, default=None, metavar="R", help="only the gaps of rank R")
    p.add_argument("--json", action="store_true", help="print the gaps as JSON")
    p.set_defaults(func=cmd_explain)


def cmd_explain(args) -> int:
    from ..causes import gap_json, lines
    from ..explain import explain, explain_ranks, idle_by_cause, memory_summary
    from ..report import result
    from ..simulate import simulate
    from .common import UsageError

    sched = schedule_from(args)
    if args.rank is not None and not 0 <= args.rank < sched.ranks:
        raise UsageError(f"--rank must be in 0..{sched.ranks - 1}; got {args.rank}")
    costs = costs_from(args, sched)
    given = sched
    sched = placed(args, sched, costs)
    tl = simulate(sched, costs, check=not read_checked(args) or sched is not given)
    res = result(sched, costs, tl)
    every = explain(tl)
    gaps = every if args.rank is None else explain_ranks(tl, [args.rank])
    by_cause = idle_by_cause(every)
    if args.json:
        print_json({"schedule": res["schedule"], "ranks": res["ranks"], "microbatches": res["microbatches"],
                    "chunks": res["chunks"], "costs_per": args.costs_per, "makespan": res["makespan"],
                    "bubble_fraction": res["bubble_fraction"],
                    "formula_bubble_fraction": res["formula_bubble_fraction"], "idle": sum(res["idle"]),
                    "idle_by_cause": by_cause, "gaps": [gap_json(g, tl) for g in gaps],
                    **({"memory_actions": memory_summary(tl)} if sched.memory_actions else {})})
        return 0
    print(summary_line(res, by_cause, args.costs_per))
    if sched.memory_actions:
        print(memory_summary(tl))
    for g in gaps:
        words, exact = lines(g, tl)
        print(f"{words}\n    {exact}")
    return 0


def summary_line(res: dict, by_cause: dict[str, float], costs_per: str = "stage") -> str:
    """'1f1b p=4 m=8 v=1, costs per stage: makespan 33, bubble 27.3% (closed form 27.3%): idle 36 = fill 18 +
    drain 18'. Per stage, a v-chunk family's times are v times those of one rank's share (what demo and the
    workshop draw), so the line says which it is."""
    formula = res["formula_bubble_fraction"]
    closed = f" (closed form {formula:.1%})" if formula is not None else ""
    parts = " + ".join(f"{cause} {x:.4g}" for cause, x in by_cause.items() if x > 0) or "0"
    basis = "costs per rank's share" if costs_per == "rank" else (
        "costs per stage (--costs-per rank: one rank's share, as demo and the workshop)" if res["chunks"] > 1
        else "costs per stage")
    return (f"{res['schedule']} p={res['ranks']} m={res['microbatches']} v={res['chunks']}, {basis}: makespan "
            f"{res['makespan']:.4g}, bubble {res['bubble_fraction']:.1%}{closed}: idle {sum(res['idle']):.4g} = "
            f"{parts}")
