"""`stagewise auto`: the best order under a memory cap per rank, for the shared step end or each rank's span."""

from __future__ import annotations

import sys
import time

from .. import limits
from ..flags import add_layout_options
from .memory import add_recompute_at
from .common import UsageError, add_cost_args, costs_from, finite_float, positive_int, print_json


def register(sub) -> None:
    p = sub.add_parser(
        "auto", help="find the best order under a memory cap (zero-bubble search), and the proven optimum",
        description="Greedy list scheduling with split backward (W fills the bubbles) under a memory cap per rank "
        "(--cap in chunk-units, --cap-bytes in bytes; --free-at-i or the model shape say what I frees), tried "
        "with several warm-up limits and a local search; the best of those and of every named family is `auto`. "
        "--objective step minimises the shared step end, span each rank's own span (the Zero Bubble paper's "
        "measure). With --optimum (p <= 4, m <= 8) a mixed-integer program proves the best order.")
    add_layout_options(p, ("pp",), defaults={"pp": 4}, more={"pp": "one stage each; default 4"})
    p.add_argument("-m", "--microbatches", type=positive_int, default=8, help="micro-batches, default 8")
    p.add_argument("--objective", choices=("step", "span"), default="step",
                   help="'step' (default): the shared step end; 'span': the longest rank's own span")
    add_cost_args(p, lengths=False)  # its search plays micro-batches alike
    p.add_argument("--optimum", action="store_true", help="also solve for the proven optimum (p <= 4, m <= 8)")
    p.add_argument("--time-limit", type=finite_float, default=20.0,
                   help="seconds for the search (and again for the optimum), default 20")
    p.add_argument("--csv", default=None, metavar="FILE", help="write the auto order as torch CSV")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="draw the auto timeline (.png .svg .txt ...)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.add_argument("--memory-actions", action="store_true",
                   help="also choose, for each named family, per stage keep / offload / recompute under the cap "
                        "(offload over --host-bandwidth) and report the least simulated step that fits and what it "
                        "costs over no cap")
    add_recompute_at(p, "with --memory-actions: ")
    p.set_defaults(func=cmd_auto)


def cmd_auto(args) -> int:
    from ..plan.auto import CapError, auto_schedule
    from ..plan.errors import PlanError
    from ..report import result

    p, m = args.ranks, args.microbatches
    if not args.time_limit > 0:
        raise UsageError(f"--time-limit must be > 0 seconds; got {args.time_limit:g}")
    if args.output:
        from .common import check_timeline_output

        check_timeline_output("-o", args.output)
    limits.check_schedule_size(p, m, 1, 3, name="auto", actions=limits.AUTO_ACTIONS)
    costs = costs_from(args)
    cap, unit_bytes = _cap(costs, p)
    if args.recompute_at != "backward" and not args.memory_actions:
        raise UsageError("--recompute-at places the recomputes --memory-actions chooses; give --memory-actions too")
    memory = _memory_actions(args, costs) if args.memory_actions else None
    try:
        with _LateBar() as bar:
            res = auto_schedule(p, m, costs, cap, unit_bytes=unit_bytes, objective=args.objective,
                                time_limit=args.time_limit, progress=bar.update)
    except CapError as e:
        text = ",".join(f"{x:g}" for x in costs.cap.values) if costs.cap else ""
        if memory:  # orders without memory actions do not fit; those with them may
            _print_memory(args, memory, note=f"no order without memory actions fits: {e}")
            return 0
        raise UsageError(f"{costs.cap.option if costs.cap else '--cap'} {text}: {e}") from None
    rows = [result(_generate(name, p, m), costs) for name in res.families]
    rows.append(result(res.schedule, costs))
    opt = None
    if args.optimum:
        from ..plan.auto import optimum

        try:
            opt = optimum(p, m, costs, cap, time_limit=args.time_limit, upper=res.value, objective=args.objective,
                          unit_bytes=unit_bytes)
        except PlanError as e:
            raise UsageError(str(e)) from None
        rows.append(result(opt.schedule, costs))
    _write(args, res.schedule, costs)
    verdict = _verdict(res, opt)
    if args.json:
        print_json({"auto": {"source": res.source, "objective": args.objective, "value": res.value,
                             "makespan": res.makespan, "seconds": res.seconds, "optimal": verdict[0]},
                    "rows": [_with_span(r) for r in rows],
                    "optimum": None if opt is None else {"value": opt.makespan, "bound": opt.bound,
                                                         "proven": opt.proven, "seconds": opt.seconds},
                    **({"memory_actions": _memory_json(memory)} if memory is not None else {})})
        return 0
    print(_auto_table(rows, args.objective))
    print(f"\nauto = {res.source} ({res.seconds:.1f} s)")
    from ..report import memory_line

    line = memory_line(rows[-2] if opt is not None else rows[-1])
    if line:
        print(line)
    print(verdict[1])
    if memory is not None:
        print()
        _print_memory(args, memory, auto_step=res.makespan)
    for path in (args.csv, args.output):
        if path:
            print(f"wrote {path}")
    return 0


def _memory_actions(args, costs) -> dict:
    """Per named one-stage-per-rank family that accepts -p and -m, its ``memory_policy`` under the cap (None:
    nothing fits)."""
    from ..plan.auto import memory_policy
    from ..schedules import FAMILIES
    from ..schedules.registry import ScheduleArgError, whole_names

    if costs.cap is None:
        raise UsageError("--memory-actions chooses what fits under a cap: give --cap or --cap-bytes")
    out = {}
    for name in whole_names():  # a sliced family at one slice is its plain family
        fam = FAMILIES[name]
        if fam.chunks is not None and 1 not in fam.chunks:
            continue
        try:
            sched = _generate(name, args.ranks, args.microbatches)
        except (ScheduleArgError, ModuleNotFoundError):
            continue
        if sched.stages == args.ranks:
            out[name] = memory_policy(sched, costs, recompute_at=args.recompute_at)
    return out


def _memory_json(memory: dict) -> list[dict]:
    return [{"schedule": name, "fits": got is not None,
             **({"policy": list(got.policy), "makespan": got.makespan, "no_cap_makespan": got.base,
                 "cost": got.cost, "peaks": list(got.peaks), "tried": got.tried, "exhaustive": got.exhaustive}
                if got is not None else {})} for name, got in memory.items()]


def _print_memory(args, memory: dict, note: str = "", auto_step: float | None = None) -> None:
    """The table of ``_memory_actions`` and the least step that fits."""
    print("with memory actions under the cap (per stage keep / offload / recompute; the least simulated step "
          f"that fits, RECOMPUTE at the {args.recompute_at}):")
    head = f"{'schedule':<18}{'makespan':>11}{'no cap':>9}{'cost':>16}  {'policy':<28}peak per rank"
    print(head + "\n" + "-" * len(head))
    for name, got in memory.items():
        if got is None:
            print(f"{name:<18}{'none fits':>11}")
            continue
        cost = f"+{got.cost:.4g} ({got.cost / got.base:+.1%})" if got.base else f"+{got.cost:.4g}"
        peaks = " ".join(f"{x:.3g}" for x in got.peaks)
        print(f"{name:<18}{got.makespan:>11.6g}{got.base:>9.6g}{cost:>16}  {got.describe():<28}{peaks}")
    fits = {n: g for n, g in memory.items() if g is not None}
    if fits:
        name = min(fits, key=lambda n: (fits[n].makespan, n))
        best = fits[name]
        than = "" if auto_step is None else f"; auto's order without them: {auto_step:.6g}"
        print(f"least step that fits: {name} with {best.describe()}: {best.makespan:.6g}, {best.cost:+.4g} over "
              f"{name} with no cap{than}")
    else:
        print("no family fits the cap even recomputing or offloading every stage")
    if note:
        print(note)


def _cap(costs, p: int):
    """(cap per rank or None, whether in bytes); `auto` itself refuses a cap below what any order needs."""
    if costs.cap is None:
        return None, False
    vals = [float(x) for x in costs.cap.values]
    vals = vals * p if len(vals) == 1 else vals
    if len(vals) != p:
        raise UsageError(f"{costs.cap.option} has {len(vals)} values; give one, or one per rank ({p})")
    return vals, costs.cap.unit == "bytes"


def _generate(name: str, p: int, m: int):
    from ..schedules import generate

    return generate(name, p, m, 1)


def _with_span(row: dict) -> dict:
    """A result with the longest rank span and the Zero Bubble paper's bubble rate (1 - work / that span)."""
    span = max(b + s for b, s in zip(row["busy"], row["span_idle"]))
    return {**row, "span": span, "span_bubble_rate": 1 - max(row["busy"]) / span if span > 0 else 0.0}


def _verdict(res, opt) -> tuple[bool | None, str]:
    if opt is None:
        return None, "optimal: not known (a heuristic; --optimum proves it for p <= 4, m <= 8)"
    if opt.proven and res.value <= opt.makespan * (1 + 1e-6):
        return True, f"optimal: yes, proven by the MILP ({opt.seconds:.1f} s)"
    if opt.proven:
        return False, f"optimal: no; the proven optimum is {opt.makespan:.6g} ({opt.seconds:.1f} s)"
    return None, (f"optimal: not known; the MILP's best in {opt.seconds:.1f} s is {opt.makespan:.6g}, "
                  f"its lower bound {opt.bound:.6g}")


def _write(args, schedule, costs) -> None:
    if args.csv:
        from .. import torch_csv

        try:
            torch_csv.dump(schedule, args.csv)
        except OSError as e:
            raise UsageError(f"--csv {args.csv}: cannot write: {e.strerror}") from None
    if args.output:
        from ..render.output import OutputError, write_timeline
        from ..simulate import simulate

        try:
            write_timeline(simulate(schedule, costs), args.output)
        except OutputError as e:
            raise UsageError(f"-o {e}") from None


def _auto_table(rows, objective: str) -> str:
    head = f"{'schedule':<18}{'makespan':>13}{'span':>13}{'bubble':>8}{'span bubble':>12}  peak activations per rank"
    lines = [head, "-" * len(head)]
    for r in map(_with_span, rows):
        peaks = " ".join(f"{x:.3g}" for x in r["peak_activations"])
        lines.append(f"{r['schedule']:<18}{r['makespan']:>13.7g}{r['span']:>13.7g}{r['bubble_fraction']:>8.2%}"
                     f"{r['span_bubble_rate']:>12.2%}  {peaks}")
    lines.append(f"(objective: {'the shared step end, makespan' if objective == 'step' else 'the longest span'})")
    return "\n".join(lines)


class _LateBar:
    """A rich progress bar on stderr (a terminal, rich installed) that shows only once a search passes a second."""

    def __init__(self, after: float = 1.0):
        self.after, self.t0, self.bar, self.task = after, time.perf_counter(), None, None
        self.enabled = sys.stderr.isatty()

    def __enter__(self):
        return self

    def update(self, done: int, total: int) -> None:
        if not self.enabled or time.perf_counter() - self.t0 < self.after:
            return
        if self.bar is None:
            try:
                from rich.console import Console
                from rich.progress import Progress
            except ImportError:
                self.enabled = False
                return
            self.bar = Progress(console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("searching orders", total=total)
        self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
