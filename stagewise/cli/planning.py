"""What every `stagewise plan` form shares: where a plan goes (-o) and the command line it records, the
progress bar, lists of whole numbers, and whether torch's CSV carries a schedule."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..flags import FLAGS, PLANNER_ALIASES, planner_dest
from .common import UsageError


@dataclass(frozen=True, kw_only=True)
class Destinations:
    """Where a plan goes, checked before the search: the winner's CSV and, for .md/.json, the plan itself."""

    csv: str
    plan: str | None
    argv: list

    def write(self, plan: dict, text: str) -> None:
        """The written plan (``text`` for .md, ``plan`` as JSON for .json)."""
        if self.plan is None:
            return
        from ..jsonout import dumps

        try:
            Path(self.plan).write_text(text if self.plan.endswith(".md") else dumps(plan, indent=1) + "\n",
                                       encoding="utf-8")
        except OSError as e:
            raise UsageError(f"-o {self.plan}: cannot write: {e.strerror}") from None


def destinations(args) -> Destinations:
    """``-o``'s files, refused before any work if their folder is missing or not writable."""
    from ..render.output import OutputError, check_path

    if args.output is not None and not args.output.strip():
        raise UsageError("-o '': give a file name (FILE.csv, FILE.md or FILE.json), or leave -o out for plan.csv")
    target = args.output if args.output is not None else "plan.csv"
    try:
        path = check_path(target, (".csv", ".md", ".json"))
        csv = str(path) if path.suffix.lower() == ".csv" else str(path.with_suffix(".csv"))
        if csv != str(path):
            check_path(csv, (".csv",))
    except OutputError as e:
        raise UsageError(f"-o {e}") from None
    plan = None if csv == str(path) else str(path)
    return Destinations(csv=csv, plan=plan, argv=command_line(args))


def said_default(args) -> str:
    """What the output says when -o was left out (it writes into the current folder)."""
    return "" if args.output else "; the default -o, in the current folder: give -o FILE for another place"


#: (option, attribute) of `plan`, for the command line a written plan records
_OPTIONS = (("--profile", "profile"), ("-N", "devices"), ("-G", "global_batch"), ("--memory", "memory"),
            ("--per-node", "per_node"), ("--intra-bandwidth", "intra_bandwidth"), ("--intra-latency", "intra_latency"),
            ("--inter-bandwidth", "inter_bandwidth"), ("--inter-latency", "inter_latency"), ("--model", "model"),
            ("--hardware", "hardware"), ("--gpus", "gpus"), ("--global-batch-tokens", "global_batch_tokens"),
            *((FLAGS[name], planner_dest(name)) for name in PLANNER_ALIASES),  # --tp, --ranks, --ep, --etp
            ("--expert-placement", "expert_placement"),
            ("--recompute-modules", "recompute_modules"), ("--framework", "framework"),
            ("--sharding", "sharding"), ("--hsdp-shard", "hsdp_shard"), ("--schedules", "schedules"),
            ("--chunks", "chunks"), ("--micro-batch-sizes", "micro_batch_sizes"), ("--layout", "layout"),
            ("--memory-reserve", "memory_reserve"), ("--top", "top"), ("-o", "output"))


def command_line(args) -> list[str]:
    """The `stagewise plan` command that makes this plan again (the options given, in a fixed order)."""
    out = ["stagewise", "plan"]
    for flag, key in _OPTIONS:
        value = getattr(args, key, None)
        if value is not None:
            out += [flag, str(value)]
    if getattr(args, "recompute", "both") != "both":
        out += ["--recompute", args.recompute]
    if getattr(args, "precision", "bf16") != "bf16":
        out += ["--precision", args.precision]
    for flag, key in (("--no-sequence-parallel", "no_sequence_parallel"), ("--no-zero", "no_zero"),
                      ("--fp8-all-gather", "fp8_all_gather"), ("--async-tp", "async_tp")):
        if getattr(args, key, False):
            out.append(flag)
    return out


def csv_round_trips(schedule) -> bool:
    """Whether torch's CSV carries the whole schedule (DualPipe's two lanes it does not)."""
    from .. import torch_csv
    from ..validate import ScheduleError

    try:
        back = torch_csv.loads(torch_csv.dumps(schedule))
    except ScheduleError:
        return False
    return back.programs == schedule.programs and back.placement == schedule.placement and back.lanes == schedule.lanes


def whole_numbers(text: str, option: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]  # '' and '1,,2' fail here: a default is the option left out
    except ValueError:
        raise UsageError(f"{option} {text[:40]!r}: expected whole numbers separated by commas, e.g. 1,2,4 (leave "
                         "the option out for its default)") from None
    if any(v < 1 for v in vals):
        raise UsageError(f"{option} {text!r}: every value must be >= 1")
    return vals


class ProgressBar:
    """A rich progress bar on stderr when it is a terminal (and rich is installed); silent otherwise."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and sys.stderr.isatty()
        self.bar = None

    def __enter__(self):
        if self.enabled:
            try:
                from rich.console import Console
                from rich.progress import Progress

                self.bar = Progress(console=Console(stderr=True), transient=True)
                self.bar.start()
                self.task = self.bar.add_task("simulating configurations", total=None)
            except ImportError:
                self.bar = None
        return self

    def update(self, done: int, total: int) -> None:
        if self.bar is not None and (done % 16 == 0 or done == total):
            self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
