"""What every subcommand shares: option groups, error handling, JSON output."""

from __future__ import annotations

import argparse
import sys

from ..costs import CostError, Costs, rank_share_weights, scaled
from ..errors import StagewiseError
from ..flags import add_layout_options
from ..option_values import UsageError, finite_float, per_stage_value, positive_int, whole_int  # noqa: F401 (their home)


#: errors that are the user's input, not our bug: one line on stderr, exit 2
USER_ERRORS: tuple[type[BaseException], ...] = (StagewiseError,)  # every library input error (errors.py)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) and exit code 2.

    ``described_by``: a function giving the description when help is printed, so that a description built
    from a heavy module (the planner's tie rule) costs nothing to the commands that never print it.
    """

    described_by = None
    _laying_out = False  #: in format_help or format_usage: the formatter needs the terminal's width

    def format_help(self) -> str:
        if self.described_by is not None:
            self.description = self.described_by()
        return self._laid_out(super().format_help)

    def format_usage(self) -> str:
        return self._laid_out(super().format_usage)

    def _laid_out(self, fmt):
        self._laying_out = True
        try:
            return fmt()
        finally:
            self._laying_out = False

    def _get_formatter(self):
        # argparse also builds a formatter for each add_argument (to check the metavar) and add_subparsers (the
        # prog); those never wrap text, so they get a fixed width instead of the terminal's, which argparse reads
        # with shutil, and shutil imports bz2, lzma and zlib: a tenth of `stagewise simulate`'s start-up
        if self._laying_out:
            return super()._get_formatter()
        return self.formatter_class(prog=self.prog, width=80)

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def family_names(text: str | None, option: str = "--schedules") -> tuple[str, ...] | None:
    """'1f1b, zb-v' -> ('1f1b', 'zb-v'), each a known family; None (the option not given) stays None.

    An empty text, or an empty name in the list, is refused: "all families" is the option left out, never ''.
    """
    from ..schedules import FAMILIES

    if text is None:
        return None
    if len(text) > 10_000:
        raise UsageError(f"{option}: a list of at most 10,000 characters; got {len(text)}")
    names = tuple(x.strip() for x in text.split(","))
    if not all(names):
        raise UsageError(f"{option} {text!r}: give one or more schedule families separated by commas, e.g. "
                         f"1f1b,zb-v (leave the option out for every family)")
    bad = [n for n in names if n not in FAMILIES]
    if bad:
        raise UsageError(f"{option}: unknown schedule {bad[0]!r}; choose from {', '.join(FAMILIES)}")
    return names


def int_list(option: str, text: str | None, example: str):
    """'3,2,2,3' -> (3, 2, 2, 3) for ``option``; None stays None."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{option} {text}: expected {example}") from None


def check_timeline_output(option: str, path: str) -> None:
    """Fail on a bad output path (suffix, folder, permissions) before any work is done."""
    from ..render.output import TIMELINE_SUFFIXES, OutputError, check_path

    try:
        check_path(path, TIMELINE_SUFFIXES)
    except OutputError as e:
        raise UsageError(f"{option} {e}") from None


def add_schedule_args(p: argparse.ArgumentParser, *, csv: bool = True, name_required: bool = False) -> None:
    """NAME -p P -m M [-v V] and, optionally, --csv FILE instead of NAME."""
    p.add_argument("name", nargs=None if name_required else "?", metavar="NAME",
                   help="schedule family (see `stagewise list`)")
    add_shape_args(p)
    if csv:
        p.add_argument("--csv", metavar="FILE", help="read the schedule from torch's compute-only CSV instead of NAME")


def add_shape_args(p: argparse.ArgumentParser, *,
                   chunks: str = "stages per rank for interleaved/V schedules (family default if omitted)") -> None:
    """-p P (``Parallelism.pp``'s option) -m M -v V, with the defaults every schedule command shares."""
    add_layout_options(p, ("pp",), defaults={"pp": 4}, more={"pp": "default 4"})
    p.add_argument("-m", "--microbatches", type=positive_int, default=8, help="micro-batches per step, default 8")
    p.add_argument("-v", "--chunks", type=positive_int, default=None, help=chunks)
    p.add_argument("--slices", type=positive_int, default=1,
                   help="sequence slices per micro-batch for the families that take them (Seq1F1B: seq1f1b, "
                        "seq1f1b-zb), default 1: -m counts micro-batches, the schedule m x slices units (with "
                        "--csv: its micro-batch indices are those units)")


def add_cost_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("costs (per action: one stage, one micro-batch; a comma list gives one value per stage)")
    g.add_argument("--tf", type=per_stage_value, default=1.0, help="forward time, default 1")
    g.add_argument("--tb", type=per_stage_value, default=2.0, help="full backward time, default 2")
    g.add_argument("--ti", type=per_stage_value, default=None, help="input-gradient backward, default tb/2")
    g.add_argument("--tw", type=per_stage_value, default=None, help="weight-gradient backward, default tb/2")
    g.add_argument("--tfb", type=per_stage_value, default=None,
                   help="overlapped F&B pair, set by hand; default derived: tf+tb, less the all-to-all it hides")
    g.add_argument("--latency", type=finite_float, default=0.0, help="time of one message between ranks, default 0")
    g.add_argument("--bandwidth", type=finite_float, default=None, help="link bytes per time unit (default: free)")
    g.add_argument("--boundary-bytes", type=per_stage_value, default=0.0,
                   help="bytes of the activation each stage sends on")
    g.add_argument("--activation-bytes", type=per_stage_value, default=None,
                   help="bytes one stage keeps per micro-batch (peak memory in bytes)")
    g.add_argument("--costs-per", choices=("stage", "rank"), default="stage",
                   help="'stage' (default): durations and activations are per stage; 'rank': they are one "
                        "rank's share of the model, so a chunk of a v-chunk schedule costs 1/v (same-model "
                        "comparison across families)")
    from .comm import add_comm_args
    from .memory import add_memory_args
    from .expert_options import add_a2a_args

    add_memory_args(p)
    add_a2a_args(p)
    add_comm_args(p)


def costs_from(args: argparse.Namespace, schedule=None) -> Costs:
    """The cost options; with ``--costs-per rank`` and a schedule, scaled to its stages' shares."""
    from .comm import comm_costs
    from .memory import memory_costs
    from .expert_options import a2a_costs

    costs = comm_costs(args, a2a_costs(args, memory_costs(args, _base_costs(args))))
    if schedule is not None and getattr(args, "costs_per", "stage") == "rank":
        return scaled(costs, rank_share_weights(schedule))
    return costs


def costs_basis(args: argparse.Namespace) -> str:
    """What the durations describe, in words: a makespan means nothing without it (demo and the workshop use
    one rank's share, so a v-chunk family's makespan there is 1/v of the per-stage one)."""
    if getattr(args, "costs_per", "stage") == "rank":
        return "costs: one rank's share of the model (--costs-per rank; a chunk of a v-chunk schedule costs 1/v)"
    return ("costs: per stage (each stage one --tf/--tb; --costs-per rank makes them one rank's share of the "
            "model, as demo and the workshop do)")


def _base_costs(args: argparse.Namespace) -> Costs:
    return Costs(t_f=args.tf, t_b=args.tb, t_i=args.ti, t_w=args.tw, t_fb=args.tfb,
                 latency=args.latency, bandwidth=args.bandwidth, boundary_bytes=args.boundary_bytes,
                 activation_bytes=args.activation_bytes)


def schedule_from(args: argparse.Namespace):
    """The schedule named by NAME -p -m -v (generated: the command checks it as it plays it), or read from --csv
    (validated as it is read: ``read_checked``)."""
    from ..schedules import generate

    if getattr(args, "csv", None):
        from .. import torch_csv

        if args.name:
            raise UsageError(f"give either NAME ({args.name}) or --csv, not both")
        from .. import limits
        from ..lowering import torch_comms

        if torch_comms.has_comms(limits.read_text(args.csv, "--csv")):  # torch's compute+comms CSV
            if getattr(args, "slices", 1) != 1:
                raise UsageError("--slices reads a compute-only CSV's units as slices; a compute+comms CSV is "
                                 "lowered as it is written: leave --slices out")
            from ..lowering.check import check

            args.lowered = check(torch_comms.load(args.csv))  # its sends, receives and collectives must match
            from ..validate import validate

            return validate(args.lowered.schedule)
        sched = torch_csv.load(args.csv)
        if getattr(args, "slices", 1) != 1:  # its units as slices: checked again under the slice rules
            from dataclasses import replace

            from ..validate import validate

            return validate(replace(sched, slices=args.slices))
        return sched
    if not args.name:
        raise UsageError("a schedule NAME or --csv FILE is required")
    return generate(args.name, args.ranks, args.microbatches, args.chunks, getattr(args, "slices", 1))


def read_checked(args: argparse.Namespace) -> bool:
    """Whether ``schedule_from(args)`` validated its schedule (a --csv), so that the command does not again: a
    second check or play of a read schedule finds nothing the first did not."""
    return bool(getattr(args, "csv", None))


def print_json(obj) -> None:
    """``obj`` as strict JSON on stdout (no NaN or Infinity: see ``jsonout``)."""
    from ..jsonout import dumps

    sys.stdout.write(dumps(obj, indent=2) + "\n")


def fmt_list(xs, digits: int = 3) -> str:
    return "[" + ", ".join(f"{x:.{digits}g}" for x in xs) + "]"
