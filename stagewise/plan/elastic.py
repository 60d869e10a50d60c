"""Re-plan a run's layout for the ranks left after a failure (``train --elastic MIN:MAX``).

The rule, in order (Oobleck's and Varuna's idea, a pipeline re-planned for the GPUs that are left):

1. keep the pipeline and drop data-parallel replicas: ``dp`` falls to what the ranks left hold;
2. else re-partition the layers over fewer stages (one replica), the split chosen by the planner's exact
   partitioner (``plan.search.partition``) from per-layer costs (the run's measured or estimated ones).

Either way the global batch is kept, and so is each micro-batch's size: the rows a dropped replica took go to
more micro-batches on the ones left (``m x dp`` stays), so the loss of every step is the same mean over the
same sequences. A layout that cannot be had (too few ranks, m or the batch that does not divide, more stages
than layers, a schedule family that refuses it) is refused naming why. No torch.

Example:
    >>> from stagewise.parallelism import Parallelism
    >>> r = replan(Parallelism(pp=2, dp=2), ranks_left=3, minimum=2, microbatches=4, batch=16)
    >>> r.parallelism.describe(), r.microbatches
    ('pp 2', 8)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from ..parallelism import Parallelism
from .errors import PlanError


class ElasticError(PlanError):
    """No layout fits the ranks left (the message says why, in the run's option names)."""


@dataclass(frozen=True, kw_only=True)
class Replan:
    """The layout a restart runs on."""

    parallelism: Parallelism
    microbatches: int  #: m per replica: the old m x dp / the new dp
    split: tuple[int, ...] | None  #: layers per stage when the stages changed (None: as before)
    why: str  #: one line: what was dropped and what was kept


def replan(par: Parallelism, *, ranks_left: int, minimum: int, microbatches: int, batch: int,
           schedule: str | None = None, layer_time: Sequence[float] | None = None,
           layer_bytes: Sequence[float] | None = None, memory: float | None = None) -> Replan:
    """The layout for ``ranks_left`` ranks (>= ``minimum``, the run's `elastic` MIN): fewer dp replicas if
    they fit, else fewer stages, split by ``layer_time`` (one number per model layer; None: evenly). With
    ``layer_bytes`` (each layer's model state: weights, gradients, optimizer) and ``memory`` (bytes per
    device), a split whose fullest rank holds more state than that is refused (activations not counted: a
    dropped replica's rows go to more micro-batches of the same size, not to bigger ones)."""
    if ranks_left < minimum:
        are = "rank is" if ranks_left == 1 else "ranks are"
        raise ElasticError(f"`elastic` MIN {minimum}: only {ranks_left} {are} left; the run stops (give a lower MIN "
                           "to go on with fewer)")
    rows = batch // (microbatches * par.data_shards)  # per micro-batch: kept
    total_m = microbatches * par.dp  # micro-batches of one data shard of the fsdp x ep group, over all replicas
    tried = []
    keep = par.pp * par.fsdp * par.tp * par.ep
    for dp in range(min(par.dp, ranks_left // keep), 0, -1):
        if total_m % dp:
            tried.append(f"dp {dp}: m x dp = {total_m} does not divide by it")
            continue
        new = dataclasses.replace(par, dp=dp, zero=par.zero if dp > 1 else 0)
        m = total_m // dp
        problem = _schedule_problem(schedule, new.pp, m)
        if problem:
            tried.append(f"dp {dp}: {problem}")
            continue
        return Replan(parallelism=new, microbatches=m, split=None,
                      why=f"dropped {par.dp - dp} of {par.dp} dp replicas; m {microbatches} -> {m} keeps the global "
                      f"batch {batch} in micro-batches of {rows}")
    per_stage = par.fsdp * par.tp * par.ep
    layers = len(layer_time) if layer_time is not None else None
    for pp in range(min(par.pp - 1, ranks_left // per_stage), 0, -1):
        if pp * per_stage < 2:
            tried.append(f"pp {pp}: one rank runs the unpipelined reference, which keeps no checkpoints")
            break
        new = dataclasses.replace(par, pp=pp, dp=1, zero=0)
        problem = _schedule_problem(schedule, pp, total_m)
        if problem:
            tried.append(f"pp {pp}: {problem}")
            continue
        split = None
        if layer_time is not None:
            split = _split(schedule, pp, total_m, layer_time, layer_bytes, memory, per_stage // par.ep)
            if isinstance(split, str):
                tried.append(f"pp {pp}: {split}")
                continue
        how = (f"split {','.join(map(str, split))} by the partitioner" if split else
               "every layer on it" if pp == 1 else "split evenly")
        return Replan(parallelism=new, microbatches=total_m, split=split,
                      why=f"{par.pp} -> {pp} stages ({how}), dp {par.dp} -> 1; m {microbatches} -> {total_m} keeps "
                      f"the global batch {batch} in micro-batches of {rows}")
    detail = "; ".join(tried) or f"the layout {par.describe()} needs at least {keep} ranks per replica"
    left = f"{ranks_left} rank{'s' if ranks_left != 1 else ''}"
    raise ElasticError(f"`elastic`: no layout fits the {left} left ({detail}); the run stops"
                       + (f" ({layers} layers)" if layers is not None and not tried else ""))


def _schedule_problem(schedule: str | None, p: int, m: int) -> str | None:
    """Why the family cannot make p ranks x m micro-batches (None: it can, or no family is named)."""
    if schedule is None:
        return None
    from ..schedules import ScheduleArgError, generate

    try:
        generate(schedule, p, m)
    except (ScheduleArgError, ValueError) as e:
        return str(e)
    return None


def _split(schedule: str | None, p: int, m: int, layer_time: Sequence[float], layer_bytes=None, memory=None,
           shards: int = 1):
    """The partitioner's split of the layers over this schedule's stages (a message when it has none, or when
    the fullest rank's state, each layer's over the ``shards`` ranks that split it, passes ``memory``)."""
    from ..schedules import generate
    from .search import LayerCosts, PartitionError, fmt_bytes, holding, partition

    sched = generate(schedule or "1f1b", p, m)
    h = holding(sched)
    if h.pieces > len(layer_time):
        return f"{h.pieces} stages need at least {h.pieces} layers; the model has {len(layer_time)}"
    zeros = tuple(0.0 for _ in layer_time)
    fixed = zeros if layer_bytes is None else tuple(float(b) / shards for b in layer_bytes)
    try:
        part = partition(LayerCosts(time=tuple(float(t) for t in layer_time), fixed=fixed, act=zeros), h, memory)
    except PartitionError as e:
        return str(e)
    if not part.fits:
        return (f"its fullest rank would hold {fmt_bytes(max(part.rank_memory))} of model state, over the "
                f"{fmt_bytes(memory)} of a device")
    return None if h.pieces == 1 else part.counts  # one stage holds every layer: nothing to split
