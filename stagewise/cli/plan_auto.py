"""`stagewise auto`: an order faster than every family for uneven stage costs, and the proven optimum."""

from __future__ import annotations

from .. import limits
from .common import UsageError, add_cost_args, costs_from, finite_float, positive_int, print_json
from .plan import _int_list


def register(sub) -> None:
    p = sub.add_parser(
        "auto", help="find an order faster than every family for uneven stage costs (and the proven optimum)",
        description="Greedy list scheduling with split backward (W fills the bubbles) under a memory cap, tried "
        "with several warm-up limits; the fastest of those and of every named family is `auto`. With --optimum "
        "(p <= 4, m <= 8) a mixed-integer program proves the fastest order and each family's distance from it.")
    p.add_argument("-p", "--ranks", type=positive_int, default=4, help="ranks = stages (one per rank), default 4")
    p.add_argument("-m", "--microbatches", type=positive_int, default=8, help="micro-batches, default 8")
    p.add_argument("--cap", default=None, metavar="N[,N..]",
                   help="most live activations (micro-batches) per rank, one number or one per rank")
    add_cost_args(p)
    p.add_argument("--optimum", action="store_true", help="also solve for the proven optimum (p <= 4, m <= 8)")
    p.add_argument("--time-limit", type=finite_float, default=120.0, help="seconds for the optimum, default 120")
    p.add_argument("--csv", default=None, metavar="FILE", help="write the auto order as torch CSV")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_auto)


def cmd_auto(args) -> int:
    from .. import torch_csv
    from ..plan.auto import auto_schedule
    from ..plan.errors import PlanError
    from ..report import result

    p, m = args.ranks, args.microbatches
    if not args.time_limit > 0:
        raise UsageError(f"--time-limit must be > 0 seconds; got {args.time_limit:g}")
    limits.check_schedule_size(p, m, 1, 3, name="auto", actions=limits.AUTO_ACTIONS)
    costs = costs_from(args)
    cap = None
    if args.cap:
        cap = _int_list(args.cap, "--cap")
        cap = cap * p if len(cap) == 1 else cap
        if len(cap) != p:
            raise UsageError(f"--cap has {len(cap)} values; -p is {p}")
    try:
        res = auto_schedule(p, m, costs, cap)
    except ValueError as e:
        raise UsageError(f"--cap {args.cap}: {e}") from None
    rows = [result(generate_one(name, p, m), costs) for name in res.families]
    rows.append(result(res.schedule, costs))
    opt = None
    if args.optimum:
        from ..plan.milp import optimum

        try:
            opt = optimum(p, m, costs, cap, time_limit=args.time_limit, upper=res.makespan)
        except PlanError as e:
            raise UsageError(str(e)) from None
        rows.append(result(opt.schedule, costs))
    if args.csv:
        try:
            torch_csv.dump(res.schedule, args.csv)
        except OSError as e:
            raise UsageError(f"--csv {args.csv}: cannot write: {e.strerror}") from None
    if args.json:
        print_json({"auto": {"source": res.source, "makespan": res.makespan}, "rows": rows,
                    "optimum": None if opt is None else {"makespan": opt.makespan, "bound": opt.bound,
                                                         "proven": opt.proven, "seconds": opt.seconds}})
        return 0
    print(_auto_table(rows, opt))
    print(f"\nauto = {res.source}")
    if opt is not None:
        word = "proven optimum" if opt.proven else f"best found in {args.time_limit:g} s (lower bound {opt.bound:.4g})"
        print(f"optimum: {opt.makespan:.4g}, {word}, {opt.seconds:.1f} s")
    if args.csv:
        print(f"wrote {args.csv}")
    return 0


def generate_one(name: str, p: int, m: int):
    from ..schedules import generate

    return generate(name, p, m, 1)


def _auto_table(rows, opt) -> str:
    ref = opt.makespan if opt is not None else None
    head = f"{'schedule':<18}{'makespan':>10}{'bubble':>8}{'vs optimum':>12}  peak activations per rank"
    lines = [head, "-" * len(head)]
    for r in rows:
        gap = f"{r['makespan'] / ref - 1:+.1%}" if ref else "-"
        peaks = " ".join(f"{x:g}" for x in r["peak_activations"])
        lines.append(f"{r['schedule']:<18}{r['makespan']:>10.4g}{r['bubble_fraction']:>8.1%}{gap:>12}  {peaks}")
    return "\n".join(lines)
