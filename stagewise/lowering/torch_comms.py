"""torch.distributed.pipelining's compute+comms CSV: one row per rank, compute and communication cells in the
order the rank runs them (``_PipelineScheduleRuntime._load_csv(..., format="compute_comms")`` reads it and
``_dump_csv`` writes it).

Cells are torch's text: compute as ``torch_csv`` (``1F0``, ``(0F7;7B3)OVERLAP_F_B``), communication as
``comms`` (``1SEND_F0``, ``0UNSHARD``, ``0REDUCE_GRAD``). Writing keeps torch's kinds only (the all-to-all,
tie and step-end collectives are stagewise's and torch's loader refuses them); reading fills each send's and
receive's peer from the placement, and a gather's or reduction's group from the layout given (FSDP when it
has fsdp > 1, else dp). ``dumps(loads(text)) == text`` for any file this module or torch writes (up to the
line ends: torch writes ``\\r\\n``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .. import limits, torch_csv
from ..actions import ParseError, parse
from ..parallelism import Parallelism
from ..schedule import Schedule, infer_placement
from ..validate import ScheduleError
from ..comm_actions import RECV_B, RECV_F, REDUCE_GRAD, SEND_B, SEND_F, TORCH_KINDS, UNSHARD, CommAction, parse_comm
from .lower import Lowered
from .options import LoweringOptions


def dumps(low: Lowered) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for prog in low.programs:
        writer.writerow([str(a) for a in prog if type(a) is not CommAction or a.kind in TORCH_KINDS])
    return out.getvalue()


def dump(low: Lowered, path: str | Path) -> None:
    """Write ``low`` so that torch's ``_PipelineScheduleRuntime._load_csv(path, "compute_comms")`` runs it."""
    Path(path).write_text(dumps(low))


def has_comms(text: str) -> bool:
    """Whether CSV text has communication cells (a compute+comms file rather than a compute-only one)."""
    return any(k in text for k in ("SEND_F", "RECV_F", "SEND_B", "RECV_B"))


def loads(text: str, name: str = "csv", parallelism: Parallelism | None = None,
          options: LoweringOptions | None = None) -> Lowered:
    """The lowered schedule a compute+comms CSV describes (its compute checked as ``torch_csv`` does)."""
    rows = _rows(text)
    programs = [tuple(a for a in row if type(a) is not CommAction) for row in rows]
    try:
        placement = infer_placement(tuple(programs))
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    lanes, mbs = torch_csv.infer_lanes(programs)
    sched = Schedule(name=name, programs=tuple(programs), placement=placement, microbatches=mbs, lanes=lanes)
    par = parallelism or Parallelism(pp=sched.ranks)
    group = "fsdp" if par.fsdp > 1 else "dp"
    out = []
    for r, row in enumerate(rows):
        prog = []
        for k, a in enumerate(row):
            if type(a) is CommAction:
                a = _filled(a, placement, group, r, k)
            prog.append(a)
        out.append(tuple(prog))
    return Lowered(schedule=sched, parallelism=par, programs=tuple(out), options=options or LoweringOptions())


def load(path: str | Path, parallelism: Parallelism | None = None,
         options: LoweringOptions | None = None) -> Lowered:
    path = Path(path)
    try:
        return loads(limits.read_text(path, "--csv"), name=path.stem, parallelism=parallelism, options=options)
    except limits.LimitError as e:
        raise ScheduleError(f"--csv {path}: {e}" if not str(e).startswith("--csv") else str(e)) from None


def _filled(a: CommAction, placement, group: str, r: int, k: int) -> CommAction:
    S = len(placement)
    where = f"rank {r} position {k} ({a})"
    if a.kind in (SEND_F, RECV_F, SEND_B, RECV_B):
        other = {SEND_F: a.stage + 1, RECV_F: a.stage - 1, SEND_B: a.stage - 1, RECV_B: a.stage + 1}[a.kind]
        if not 0 <= a.stage < S or not 0 <= other < S:
            raise ScheduleError(f"{where}: no stage {other} to exchange with (stages 0..{S - 1})")
        if placement[a.stage] != r:
            raise ScheduleError(f"{where}: stage {a.stage} belongs to rank {placement[a.stage]}, not rank {r}")
        return a._replace(peer=placement[other], group="pp", stream="p2p")
    if not 0 <= a.stage < S:
        raise ScheduleError(f"{where}: stage {a.stage} out of range 0..{S - 1}")
    op = {UNSHARD: "all-gather", REDUCE_GRAD: "reduce-scatter" if group == "fsdp" else "all-reduce"}.get(a.kind, "")
    return a._replace(group=group, stream=group, op=op)


def _rows(text: str) -> list[list]:
    rows = []
    total = 0
    for r, row in enumerate(csv.reader(io.StringIO(text))):
        limits.RANKS.check(r + 1, "", detail=f"the CSV has more than {r} rows (ranks)")
        cells = []
        for col, cell in enumerate(row):
            cell = cell.strip()
            if not cell:
                continue
            if len(cell) > torch_csv.MAX_CELL:
                raise ScheduleError(f"row {r + 1} (rank {r}) column {col + 1}: not an action: a cell of "
                                    f"{len(cell)} characters (at most {torch_csv.MAX_CELL})")
            comm = parse_comm(cell)
            if comm is not None and comm.kind in TORCH_KINDS:
                cells.append(comm)
                continue
            try:
                cells.append(parse(cell))
            except ParseError:
                raise ScheduleError(f"row {r + 1} (rank {r}) column {col + 1}: not an action: {cell!r} (a compute "
                                    "action such as '2F0', or one of torch's " + ", ".join(TORCH_KINDS) +
                                    " such as '1SEND_F0', '0UNSHARD')") from None
        total += len(cells)
        limits.ACTIONS.check(total, "", detail="the CSV has too many actions")
        rows.append(cells)
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        raise ScheduleError("the CSV has no actions")
    return rows
