"""The one place a run's schedule is resolved: a family name, a ``Schedule`` value or torch's CSV, checked
against the ranks launched. ``Pipeline``, the config-driven run's preflight and the Hugging Face path all
call ``resolve_schedule``; each rule has one message. No torch here.
"""

from __future__ import annotations

from ..schedule import Schedule
from .config import RunError


def resolve_schedule(schedule, *, world: int, dp: int = 1, microbatches: int | None = None,
                     chunks: int | None = None, csv: str | None = None, launched_by: str | None = None,
                     ranks: int | None = None, across: str | None = None, slices: int | None = None) -> Schedule:
    """The schedule value for ``world`` ranks in ``dp`` replicas of one pipeline.

    ``schedule``: a family name (made for world / dp ranks with ``microbatches`` and ``chunks``) or a
    ``Schedule`` (``microbatches``/``chunks``, when given, must be its own); ``csv``: read torch's compute-only
    CSV instead. ``launched_by`` says what set the number of ranks, for the messages (``WORLD_SIZE=4``);
    ``ranks``: the pipeline ranks asked for, when they were asked for apart from the world (a run's ``ranks``).
    ``dp`` is every rank of the grid per pipeline rank; ``across`` names its parts for the messages
    (``"`dp` 2 x `fsdp` 2"``; default ``"`dp` N"``). ``slices``: sequence slices per micro-batch (a family
    that has them: ``seq1f1b``); a schedule value's own when given.

    >>> resolve_schedule("1f1b", world=4, dp=2, microbatches=4).ranks
    2
    """
    across = across or f"`dp` {dp}"
    launched_by = launched_by or f"`ranks` {world // dp if dp and world % dp == 0 else world}" + (
        f" x {across}" if dp > 1 else "")
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1 or world % dp:
        raise RunError(f"{across} does not divide the {world} ranks launched ({launched_by}); launch `ranks` x "
                       f"{across} processes")
    p = world // dp
    if csv is not None:
        from .. import torch_csv

        return _fits(torch_csv.load(csv), p, dp, launched_by, f"`csv` {csv}", across)
    if isinstance(schedule, Schedule):
        for name, value, have in (("microbatches", microbatches, schedule.microbatches // schedule.slices),
                                  ("chunks", chunks, schedule.chunks), ("slices", slices, schedule.slices)):
            if value is not None and value != have:
                raise RunError(f"`{name}` {value} but the schedule {schedule.name} has {have}; leave `{name}` out")
        return _fits(schedule, p, dp, launched_by, f"schedule {schedule.name}", across)
    if isinstance(schedule, str):
        if ranks is not None and ranks != p:
            per = f" per replica ({across})" if dp > 1 else ""
            raise RunError(f"{schedule} with `ranks` {ranks} needs {ranks} ranks{' per replica' if dp > 1 else ''}; "
                           f"{p} were launched{per} ({launched_by})")
        if microbatches is None:
            raise RunError(f"schedule {schedule!r} needs `microbatches` (micro-batches per step)")
        from ..schedules import generate

        return generate(schedule, p, microbatches, chunks, slices=slices or 1)
    raise RunError(f"`schedule` must be a family name or a Schedule; got {type(schedule).__name__}")


def _fits(sched: Schedule, p: int, dp: int, launched_by: str, src: str, across: str) -> Schedule:
    """A schedule value must be for the pipeline ranks launched."""
    if sched.ranks != p:
        top = max(range(sched.stages), key=lambda s: sched.placement[s])
        per = f" per replica ({across})" if dp > 1 else ""
        raise RunError(f"{src}: the schedule's placement needs {sched.ranks} ranks (stage {top} is on rank "
                       f"{sched.placement[top]}); {p} were launched{per} ({launched_by}): launch "
                       f"{sched.ranks * dp} (torchrun --nproc-per-node {sched.ranks * dp}) or make the schedule for "
                       f"{p} ranks")
    return sched
