"""torch.distributed.pipelining's compute-only CSV: one row per rank, one cell per action.

An empty cell is an idle slot (torch writes ``None`` entries that way). Reading
is strict: every cell must be a whole action (``0F0junk`` is rejected, unlike
torch's own parser), and the result is validated.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from . import limits
from .actions import ParseError, actions_of, parse
from .schedule import Lane, Schedule, infer_placement
from .validate import ScheduleError, validate

#: cells torch writes that are not compute: FSDP-style parameter bookkeeping, and the sends and receives of its
#: compute+comms CSV (a run places its own by the same rules, stagewise.lowering; `simulate`/`validate --csv`
#: read them as they are: lowering.torch_comms)
_TORCH_BOOKKEEPING = re.compile(r"[0-9]+(UNSHARD|RESHARD|REDUCE_GRAD)|[0-9]+(SEND|RECV)_[FB][0-9]+")


#: cells (idle slots included) allowed per action of the limit: torch's spaced CSVs have a few per action
IDLE_CELLS = 8
#: longest cell read as an action: '(123456F123456;123456B123456)OVERLAP_F_B' is 41 characters
MAX_CELL = 64


def loads(text: str, name: str = "csv") -> Schedule:
    """Parse CSV text into a validated Schedule.

    Sizes are checked against ``stagewise.limits`` (ranks, micro-batches,
    actions) before anything is allocated per stage or micro-batch.
    """
    return validate(read_schedule(text, name))


def read_schedule(text: str, name: str = "csv") -> Schedule:
    """The schedule CSV text describes, sizes checked but not validated (the workshop's editor draws a
    deadlock rather than only refusing it); ``loads`` is this and ``validate``."""
    programs = _programs(text)
    while programs and not programs[-1]:
        programs.pop()  # trailing blank lines
    if not programs:
        raise ScheduleError("the CSV has no actions")
    _check_size(programs)
    try:
        placement = infer_placement(tuple(programs))
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    lanes, mbs = infer_lanes(programs)
    return Schedule(name=name, programs=tuple(programs), placement=placement, microbatches=mbs, lanes=lanes)


def _programs(text: str) -> list[tuple]:
    """One tuple of ops per row; each cell parsed strictly, sizes capped as they are read."""
    programs: list[tuple] = []
    most, total = limits.ACTIONS.value, 0
    cells = text.count(",") + text.count("\n") + 1
    if cells > IDLE_CELLS * most:  # empty (idle) cells cost memory too: bounded before csv splits the rows
        raise limits.LimitError(f"the CSV has {cells} cells, more than {IDLE_CELLS} x the limit of {most} "
                                f"{limits.ACTIONS.what}; set {limits.ACTIONS.env}=N to raise it")
    rows = csv.reader(io.StringIO(text))
    while True:
        r = len(programs)
        try:
            row = next(rows)
        except StopIteration:
            return programs
        except csv.Error as e:  # a cell over csv's field limit (128 KiB), a NUL byte
            raise ScheduleError(f"row {rows.line_num} (rank {r}): not a CSV row: {e}") from None
        limits.RANKS.check(r + 1, "", detail=f"the CSV has more than {r} rows (ranks)")
        prog = []
        for col, cell in enumerate(row):
            cell = cell.strip()
            if not cell or _TORCH_BOOKKEEPING.fullmatch(cell):
                continue  # idle slot, or torch's parameter bookkeeping (no compute)
            if len(cell) > MAX_CELL:
                raise ScheduleError(f"row {r + 1} (rank {r}) column {col + 1}: not an action: a cell of "
                                    f"{len(cell)} characters (at most {MAX_CELL})")
            try:
                prog.append(parse(cell))
            except ParseError as e:
                raise ScheduleError(f"row {r + 1} (rank {r}) column {col + 1}: {e}") from None
        total += len(prog)
        limits.ACTIONS.check(total, "", detail=f"the CSV has more than {most} actions")
        programs.append(tuple(prog))


def _check_size(programs) -> None:
    """Stages x micro-batches the indices imply, against the limits (the validator allocates per pair)."""
    acts = [a for prog in programs for op in prog for a in actions_of(op)]
    stages = 1 + max(a.stage for a in acts)
    mbs = 1 + max(a.mb for a in acts)
    limits.MICROBATCHES.check(mbs, "", detail=f"the CSV names micro-batch {mbs - 1}, so {mbs} micro-batches")
    limits.ACTIONS.check(stages * mbs * 3, "", detail=f"the CSV names stage {stages - 1} and micro-batch "
                         f"{mbs - 1}, so up to {stages * mbs * 3} actions")


def infer_lanes(programs) -> tuple[tuple[Lane, ...], int]:
    """Micro-batch routes and count read off the forwards (the CSV names neither).

    Consecutive stages that forward the same micro-batches form a lane; more
    than one lane is kept only when the lanes split 0..m-1 into ranges between
    them (DualPipe). Otherwise one lane, with m = the most forwards any stage
    has, so that a stray index (torch's 1F1B gives its last rank 1..m) is
    reported as out of range rather than as m missing actions elsewhere.
    """
    fwd: dict[int, set[int]] = {}
    for prog in programs:
        for op in prog:
            for a in actions_of(op):
                if a.kind == "F":
                    fwd.setdefault(a.stage, set()).add(a.mb)
    runs: list[list] = []  # [first stage, last stage + 1, micro-batches]
    for s in range(max(fwd, default=-1) + 1):
        mbs = fwd.get(s, set())
        if runs and runs[-1][2] == mbs:
            runs[-1][1] = s + 1
        else:
            runs.append([s, s + 1, mbs])
    if len(runs) > 1 and _split_in_ranges([mbs for _, _, mbs in runs]):
        lanes = tuple(Lane(stage_lo=a, stage_hi=b, mb_lo=min(mbs), mb_hi=max(mbs) + 1) for a, b, mbs in runs)
        return lanes, max(lane.mb_hi for lane in lanes)
    most = max((len(mbs) for mbs in fwd.values()), default=0)
    return (), most or 1 + max(a.mb for prog in programs for op in prog for a in actions_of(op))


def _split_in_ranges(sets: list[set[int]]) -> bool:
    """Whether the sets are ranges that together split 0..m-1 without overlap."""
    start = 0
    for mbs in sorted(sets, key=lambda x: min(x, default=-1)):
        if not mbs or min(mbs) != start or len(mbs) != max(mbs) + 1 - start:
            return False
        start = max(mbs) + 1
    return True


def load(path: str | Path) -> Schedule:
    """Read a torch compute-only CSV file; raises ScheduleError with row/column on bad input."""
    path = Path(path)
    try:
        text = limits.read_text(path, "--csv")
        return loads(text, name=path.stem)
    except limits.LimitError as e:
        raise ScheduleError(f"--csv {path}: {e}" if not str(e).startswith("--csv") else str(e)) from None


def dumps(schedule: Schedule) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for prog in schedule.programs:
        writer.writerow([str(op) for op in prog])
    return out.getvalue()


def dump(schedule: Schedule, path: str | Path) -> None:
    """Write ``schedule`` so that torch's ``_load_csv`` can run it."""
    Path(path).write_text(dumps(schedule))
