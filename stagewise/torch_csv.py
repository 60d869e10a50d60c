"""torch.distributed.pipelining's compute-only CSV: one row per rank, one cell per action.

An empty cell is an idle slot (torch writes ``None`` entries that way). Reading
is strict: every cell must be a whole action (``0F0junk`` is rejected, unlike
torch's own parser), and the result is validated.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .actions import ParseError, actions_of, parse
from .schedule import Schedule, infer_placement
from .validate import ScheduleError, validate


def loads(text: str, name: str = "csv") -> Schedule:
    """Parse CSV text into a validated Schedule."""
    programs = []
    for r, row in enumerate(csv.reader(io.StringIO(text))):
        prog = []
        for col, cell in enumerate(row):
            if not cell.strip():
                continue  # idle slot
            try:
                prog.append(parse(cell))
            except ParseError as e:
                raise ScheduleError(f"row {r + 1} (rank {r}) column {col + 1}: {e}") from None
        programs.append(tuple(prog))
    while programs and not programs[-1]:
        programs.pop()  # trailing blank lines
    if not programs:
        raise ScheduleError("the CSV has no actions")
    try:
        placement = infer_placement(tuple(programs))
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    mbs = 1 + max(a.mb for prog in programs for op in prog for a in actions_of(op))
    sched = Schedule(name=name, programs=tuple(programs), placement=placement, microbatches=mbs)
    return validate(sched)


def load(path: str | Path) -> Schedule:
    """Read a torch compute-only CSV file; raises ScheduleError with row/column on bad input."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ScheduleError(f"--csv {path}: cannot read: {e.strerror}") from None
    return loads(text, name=path.stem)


def dumps(schedule: Schedule) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for prog in schedule.programs:
        writer.writerow([str(op) for op in prog])
    return out.getvalue()


def dump(schedule: Schedule, path: str | Path) -> None:
    """Write ``schedule`` so that torch's ``_load_csv`` can run it."""
    Path(path).write_text(dumps(schedule))
