"""Schedule-core subcommands: list, simulate, compare, export, validate (`demo` is cli/demo.py)."""

from __future__ import annotations

from ..report import comm_line, lowered_memory_line, result, table
from ..schedules import FAMILIES, generate
from ..simulate import simulate
from ..timeline import Timeline
from .comm import add_layout_args
from .common import (UsageError, add_cost_args, add_schedule_args, add_shape_args, costs_basis, costs_from,
                     family_names, print_json, read_checked, schedule_from)


def register(sub) -> None:
    p = sub.add_parser("list", help="list the schedule families",
                       description="Every schedule family stagewise generates, with the chunks per rank (v) it takes "
                       "and what it is; `stagewise simulate NAME` plays one, `stagewise compare` all.")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("simulate", help="simulate one schedule and print its metrics",
                       description="Generate (or read from --csv) one schedule, check it, play it against the cost "
                       "model and print its makespan, bubble next to the closed form, busy and idle time per rank "
                       "and peak memory; --draw draws it in the terminal, --json prints the result object.")
    add_schedule_args(p)
    add_cost_args(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--draw", action="store_true", help="draw the timeline in the terminal")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("compare", help="simulate several schedules with the same p, m and costs",
                       description="Simulate every family (or --schedules) with the same p, m and costs and print "
                       "one row each; --costs-per rank makes the costs one rank's share of the model (the fair "
                       "same-model comparison); -o writes them on one time axis.")
    add_shape_args(p, chunks="chunks for the families that take v")
    p.add_argument("--schedules", default=None, help="comma-separated families (default: all that accept p, m)")
    add_cost_args(p)
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per schedule")
    p.add_argument("-o", "--output", default=None, help="also write the comparison figure (PNG/SVG)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("export", help="write a schedule as torch's compute-only CSV",
                       description="Write a generated schedule as torch.distributed.pipelining's compute-only CSV "
                       "(one row per rank), which torch's runtime loads and `stagewise simulate --csv` reads back.")
    add_schedule_args(p, csv=False, name_required=True)
    p.add_argument("--csv", required=True, metavar="FILE", help="output file")
    p.add_argument("--comms", action="store_true", help="write torch's compute+comms CSV instead: the lowered "
                   "programs (sends, receives and, with --fsdp or --dp, UNSHARD, RESHARD, REDUCE_GRAD), which "
                   "_PipelineScheduleRuntime._load_csv(FILE, 'compute_comms') runs")
    add_layout_args(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("validate", help="check a schedule (NAME or --csv FILE) and say why it is invalid",
                       description="Check that every (stage, micro-batch, kind) runs once, indices are in range, "
                       "each stage sits on one rank and no rank waits in a cycle; an invalid schedule is named by "
                       "rank, position, action and what it waits for.")
    add_schedule_args(p)
    g = add_layout_args(p)
    g.add_argument("--comms", action="store_true", help="check the lowered programs too (sends and receives)")
    p.set_defaults(func=cmd_validate)


def cmd_list(args) -> int:
    for f in FAMILIES.values():
        v = "any v" if f.chunks is None else "v=" + "/".join(map(str, f.chunks))
        print(f"{f.name:<18} {v:<7} {f.summary}")
    return 0


def cmd_simulate(args) -> int:
    sched = schedule_from(args)
    costs = costs_from(args, sched)
    tl = simulate(sched, costs, check=not read_checked(args))  # played once: the result and the drawing read it
    res = result(sched, costs, tl)
    if args.json:
        print_json(res)
    else:
        print(table([res]))
        for line in (comm_line(res), lowered_memory_line(res)):
            if line:
                print(line)
    if args.draw:
        from ..render.ascii import draw_text

        print(draw_text(tl))
    return 0


def compare_results(args) -> list[dict]:
    return [res for res, _ in compare_entries(args)]


def compare_entries(args) -> list[tuple[dict, Timeline]]:
    """(result, timeline) of each family in --schedules (default: all that accept p, m)."""
    from ..compare import compare

    names = family_names(args.schedules)
    entries = compare(names, args.ranks, args.microbatches, args.chunks, lambda sched: costs_from(args, sched),
                      getattr(args, "slices", 1))
    if not entries:
        raise UsageError(f"no schedule family accepts -p {args.ranks} -m {args.microbatches}")
    return [(e.result, e.timeline) for e in entries]


def cmd_compare(args) -> int:
    from ..render.output import COMPARE_SUFFIXES, OutputError, check_path, write_comparison

    try:
        if args.output:
            check_path(args.output, COMPARE_SUFFIXES)  # fail before simulating
        entries = compare_entries(args)
        results = [res for res, _ in entries]
        if args.json:
            print_json(results)
        else:
            print(table(results))
            for line in filter(None, map(comm_line, results)):
                print(line)
            print(costs_basis(args))
        if args.output:
            path = write_comparison([tl for _, tl in entries], args.output)
            if not args.json:
                print(f"\nwrote {path}")
    except OutputError as e:
        raise UsageError(f"-o {e}") from None
    return 0


def cmd_export(args) -> int:
    sched = generate(args.name, args.ranks, args.microbatches, args.chunks, args.slices)
    try:
        if args.comms:
            from ..lowering.torch_comms import dump, dumps
            from .comm import communication

            low = communication(args, force=True).lower(sched)
            dump(low, args.csv)
            cells = sum(len(row.split(",")) for row in dumps(low).splitlines() if row)
            print(f"wrote {args.csv} ({sched.ranks} ranks, {cells} actions with communication in torch's "
                  "compute+comms format; stagewise's own all-to-all, tie and step-end actions are not in it)")
            return 0
        from .. import torch_csv

        torch_csv.dump(sched, args.csv)
    except OSError as e:
        raise UsageError(f"--csv {args.csv}: cannot write: {e.strerror}") from None
    print(f"wrote {args.csv} ({sched.ranks} ranks, {sched.num_actions} actions)")
    return 0


def cmd_validate(args) -> int:
    from ..validate import validate

    sched = schedule_from(args)
    if not read_checked(args):
        validate(sched)
    low = getattr(args, "lowered", None)
    if low is None:
        from .comm import communication

        comm = communication(args)
        low = comm.lower(sched) if comm is not None else None
    if low is not None:
        from ..lowering.check import check

        check(low)
        print(f"valid: {sched.name}, {sched.ranks} ranks, its communication matched (sends and receives in order, "
              f"collectives in one order, gathered before use), {sum(len(p) for p in low.programs)} actions")
        return 0
    print(f"valid: {sched.name}, {sched.ranks} ranks, {sched.stages} stages, {sched.microbatches} micro-batches, "
          f"{sched.num_actions} ops")
    return 0
