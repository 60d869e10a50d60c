"""Build your own: a schedule typed on the page or dragged into a new order, checked and simulated at once.

The text is one line per rank of actions (``0F0 0F1 0B0 ...``; commas work too, and a leading
``rank 0:``), read by the torch CSV reader (its size limits and messages). A schedule that runs
comes back as the view's results do, with its torch CSV; one that stops comes back with the
validator's message, the wait cycle, what ran before each rank stopped and the ops it did not reach,
so the page can draw where and why it stops. The page counts a rank's ops from 1, as a student counts
them along a line of the editor (``counted_from_1``); the validator's messages, shared with the CLI,
index the programs from 0.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .. import limits, torch_csv
from ..actions import Pair
from ..costs import CostError
from ..explain import deadlock
from ..render.cells import chunk_of_stage
from ..report import result
from ..schedule import Schedule
from ..simulate import simulate
from ..timeline import Timeline
from ..validate import ScheduleError
from .api import Settings, SettingError, _t, costs_for, drawing, field_of, gap_of, schedules_of, setting_errors, waits

#: characters of program text: the server's body limit leaves room for the settings
MAX_TEXT = 60_000


def text_of(schedule: Schedule) -> str:
    """The programs as the editor shows them: one line per rank, actions separated by spaces."""
    return "\n".join(" ".join(map(str, prog)) for prog in schedule.programs)


def schedule_of(text: str, name: str) -> Schedule:
    """The schedule the editor's text describes, not yet validated (``ScheduleError`` naming the rank and
    column of a cell that is not an action)."""
    if not isinstance(text, str):
        raise SettingError(f"programs must be text, one line per rank; got {type(text).__name__}", "programs")
    if len(text) > MAX_TEXT:
        raise SettingError(f"programs: at most {MAX_TEXT} characters; got {len(text)}", "programs")
    rows = [re.sub(r"^\s*rank\s+[0-9]+\s*:", "", line).replace(",", " ").split() for line in text.splitlines()]
    sched = torch_csv.read_schedule("\n".join(",".join(row) for row in rows), name)
    limits.WORKSHOP_ACTIONS.check(sched.num_compute_actions, "", detail=f"the programs have "
                                  f"{sched.num_compute_actions} actions")
    return sched


def edit(s: Settings, text: str, *, with_messages: bool = False) -> dict:
    """The answer to an edit: ``valid`` with the results (as ``/api/simulate``'s) and the torch CSV, or
    ``valid: false`` with the ``error`` (positions counted from 1), the op it names (``at``) and, for a
    deadlock, the ``cycle`` and its ``plain`` words. ``untouched``: the text is the family's own order
    (then the result carries the family's name, not "(edited)")."""
    with setting_errors():
        return _edit(s, text, with_messages)


def _edit(s: Settings, text: str, with_messages: bool) -> dict:
    try:
        sched, costs, stop = _run(s, text)
    except (ScheduleError, limits.LimitError) as e:
        return {"valid": False, "error": counted_from_1(str(e)), "at": named_op(str(e)), "programs": text}
    if stop is None:
        tl = simulate(sched, costs, check=False)
        res = {**result(sched, costs, tl), **drawing(tl), **waits(tl, with_messages)}
        return {"valid": True, "untouched": _untouched(s, sched), "programs": text_of(sched),
                "csv": torch_csv.dumps(sched), "results": [res]}
    return {"valid": False, "error": counted_from_1(stop.message), "plain": plain_deadlock(sched, stop),
            "programs": text_of(sched), "closed": stop.closed,
            "at": next([a.rank, a.pos] for a in stop.blocked if a is not None),
            "cycle": [[a.rank, a.pos, b.rank, b.pos] if b else [a.rank, a.pos, None, None] for a, b in stop.cycle],
            "drawing": {**drawing(stop.ran), "pending": pending(sched, stop.ran, costs)}}


def why(s: Settings, text: str, rank, pos) -> dict:
    """One gap of the edited schedule (``api.gap_of``); the schedule must run."""
    try:
        sched, costs, stop = _run(s, text)
    except (ScheduleError, limits.LimitError) as e:
        raise SettingError(counted_from_1(str(e)), "programs") from None
    if stop is not None:
        raise SettingError(counted_from_1(stop.message), "programs")
    with setting_errors():
        return gap_of(simulate(sched, costs, check=False), rank, pos)


def _run(s: Settings, text: str):
    """(schedule, costs, deadlock or None) of the text under the view's costs; the schedule is named after the
    family, "(edited)" unless the text is the family's own order."""
    sched = schedule_of(text, "edited")
    family = s.schedules[0] if s.schedules else None
    if family:
        sched = replace(sched, name=family if _untouched(s, sched) else f"{family} (edited)")
    costs = costs_for(s, sched)
    try:
        return sched, costs, deadlock(sched, costs)
    except CostError as e:
        raise SettingError(str(e), field_of(str(e))) from None


def _untouched(s: Settings, sched: Schedule) -> bool:
    """Whether ``sched`` runs the view's first family's programs, op for op."""
    try:
        own = schedules_of(replace(s, schedules=s.schedules[:1]))[0]
    except SettingError:
        return False
    return own.programs == sched.programs


def counted_from_1(message: str) -> str:
    """A validator message with each "position N" counted from 1, as the page numbers a rank's ops."""
    return re.sub(r"\bposition ([0-9]+)", lambda m: f"position {int(m[1]) + 1}", message)


def plain_deadlock(sched: Schedule, stop) -> str:
    """The wait cycle in plain words: who waits, at which of its ops (counted from 1), for what and from whom."""
    progs = sched.programs
    waits = []
    for a, b in stop.cycle:
        at = f"rank {a.rank} waits at its op {a.pos + 1} ({progs[a.rank][a.pos]})"
        waits.append(f"{at} for {progs[b.rank][b.pos]}, rank {b.rank}'s op {b.pos + 1}" if b else f"{at} for an "
                     "input no rank makes")
    if stop.closed:
        return ("the ranks wait for each other in a loop, so none can go on: " + "; ".join(waits) + ". Move one of "
                "these ops earlier or later to open the loop.")
    return "the ranks stop: " + "; ".join(waits) + "."


def pending(sched: Schedule, ran: Timeline, costs) -> list[list]:
    """Per rank, the ops it did not reach, laid out after what it ran at their durations (drawn as ghosts)."""
    sc = costs.resolve(sched.stages, sched.slices)
    chunk = chunk_of_stage(sched)
    out = []
    for r, prog in enumerate(sched.programs):
        done = len(ran.schedule.programs[r])
        t = ran.ends[r][-1] if done else 0.0
        row = []
        for op in prog[done:]:
            a = op.forward if type(op) is Pair else op
            if type(op) is Pair:
                took = sc.fb[a.stage] if sc.fb is not None else sc.f[a.stage] + sc.duration(op.backward.kind,
                                                                                          op.backward.stage)
            else:
                took = sc.duration(op.kind, op.stage)
            cell = [str(op), op.kind, chunk[a.stage], a.mb, _t(t), _t(t + took)]
            if type(op) is Pair:
                cell += [op.backward.kind, chunk[op.backward.stage]]
            row.append(cell)
            t += took
        out.append(row)
    return out


def named_op(message: str) -> list[int] | None:
    """[rank, position] of the op a validator or reader message names first, if any."""
    if m := re.search(r"rank ([0-9]+) position ([0-9]+)", message):
        return [int(m[1]), int(m[2])]
    if m := re.search(r"\(rank ([0-9]+)\) column ([0-9]+)", message):
        return [int(m[1]), int(m[2]) - 1]
    return None
