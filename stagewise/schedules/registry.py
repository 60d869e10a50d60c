"""Names of the schedule families, their argument rules, and how to make one.

``generate(name, ranks, microbatches, chunks, slices)`` checks the arguments against the
family's rules first, so a bad option gets a message naming it and the rule
instead of a failure from deep inside a generator.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from collections.abc import Callable

from .. import limits
from ..collector import gc_paused
from ..schedule import Schedule
from . import forms
from ..errors import StagewiseError


class ScheduleArgError(StagewiseError):
    """An option a family does not accept (message names option, value and rule)."""


@dataclass(frozen=True, kw_only=True)
class Family:
    """A schedule family: its generator and the arguments it accepts."""

    name: str
    target: str  #: "module:function" under stagewise.schedules
    summary: str
    chunks: tuple[int, ...] | None = (1,)  #: allowed v; None = any v >= 1
    default_chunks: int = 1
    even_ranks: bool = False
    min_microbatches: Callable[[int, int], int] = lambda p, v: 1
    min_rule: str = ""
    even_microbatches: bool = False
    split_backward: bool = False
    #: the papers' largest idle time of a rank, (p, m, v, Uniform) -> time or None where not exact (a family with
    #: slices takes k too, m micro-batches of k slices: ``forms.sliced``)
    idle: Callable[..., float | None] | None = None
    #: F&B pairs each rank runs (p, m) -> one count per rank; they cost F&B instead of F + B
    pairs: Callable[[int, int], list[int]] | None = None
    #: the papers' peak activations of the busiest rank, (p, m, v) -> micro-batches of one rank's share (a family
    #: with slices takes k too: (p, m, v, k))
    memory: Callable[..., float] | None = None
    param_copies: int = 1  #: whole-model parameter copies the ranks hold together
    #: every rank holds every micro-batch of each of its stages at its peak (all forwards before the backwards)
    holds_all: bool = False
    #: cuts micro-batches into sequence slices (Seq1F1B): its generator and forms take ``slices``
    slices: bool = False

    @property
    def generator(self) -> Callable[..., Schedule]:
        return _lazy(self.target)


def _lazy(target: str) -> Callable:
    """The function ``module:function`` under stagewise.schedules, imported on first use."""
    module, func = target.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), func)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(name="gpipe", target="gpipe:gpipe", summary="all forwards, then all backwards (GPipe)",
               idle=forms.fill, memory=lambda p, m, v: m, holds_all=True),
        Family(name="1f1b", target="one_f_one_b:one_f_one_b",
               summary="one forward one backward, PipeDream-flush",
               idle=forms.fill, memory=forms.one_f_one_b_memory),
        Family(name="interleaved-1f1b", target="interleaved:interleaved_1f1b",
               summary="Megatron-LM virtual stages: v chunks per rank, round-robin",
               chunks=None, default_chunks=2,
               min_microbatches=lambda p, v: p if v > 1 else 1, min_rule="`microbatches` >= `ranks`",
               idle=forms.fill_from_p),
        Family(name="looped-bfs", target="looped_bfs:looped_bfs",
               summary="v chunks per rank, breadth-first: every micro-batch through a chunk before the next",
               chunks=None, default_chunks=2, idle=forms.fill_from_p, holds_all=True),
        Family(name="zb-h1", target="zero_bubble:zb_h1", split_backward=True,
               summary="Zero Bubble H1: split backward, W fills the cooldown, 1F1B memory",
               idle=forms.zb_h1, memory=forms.one_f_one_b_memory),
        Family(name="zb-h2", target="zero_bubble:zb_h2", split_backward=True,
               summary="Zero Bubble H2: extra warmup forwards, W fills the rest, ~2x 1F1B memory",
               memory=lambda p, m, v: min(2 * p - 1, m)),
        Family(name="zb-v", target="zb_v:zb_v", split_backward=True, chunks=(2,), default_chunks=2,
               summary="Zero Bubble V: two chunks per rank in a V, 1F1B memory",
               memory=forms.one_f_one_b_memory),
        Family(name="v-half", target="v_shape:v_half", split_backward=True, chunks=(2,), default_chunks=2,
               summary="V-Half (controllable memory): V-shape building blocks, half of 1F1B's memory",
               memory=lambda p, m, v: min(m, (p + 2) // 2)),
        Family(name="v-min", target="v_shape:v_min", split_backward=True, chunks=(2,), default_chunks=2,
               summary="V-Min (controllable memory): V-shape building blocks, a third of 1F1B's memory",
               memory=lambda p, m, v: min(m, (p + 4) // 3)),
        Family(name="dualpipe", target="dualpipe:dualpipe", split_backward=True, chunks=(2,),
               default_chunks=2, even_ranks=True, even_microbatches=True,
               min_microbatches=lambda p, v: 2 * p, min_rule="`microbatches` >= 2 * `ranks`",
               summary="DeepSeek-V3 DualPipe: micro-batches from both ends, two parameter copies",
               idle=forms.dualpipe_idle(1), pairs=lambda p, m: _lazy("dualpipe:pairs")(p, m), param_copies=2,
               memory=lambda p, m, v: p + 1),
        Family(name="dualpipe-v", target="dualpipe_v:dualpipe_v", split_backward=True, chunks=(2,),
               default_chunks=2, min_microbatches=lambda p, v: 2 * p, min_rule="`microbatches` >= 2 * `ranks`",
               summary="DualPipeV: DualPipe cut in half, V-shape, one parameter copy",
               idle=forms.dualpipe_idle(2), pairs=lambda p, m: _lazy("dualpipe_v:pairs")(p, m),
               memory=lambda p, m, v: p + 0.5),
        Family(name="seq1f1b", target="seq1f1b:seq1f1b", slices=True,
               summary="Seq1F1B: 1F1B over sequence slices (--slices k), backwards reversed in a micro-batch",
               idle=forms.sliced(forms.fill), memory=forms.seq1f1b_memory),
        Family(name="seq1f1b-zb", target="seq1f1b:seq1f1b_zb", split_backward=True, slices=True,
               summary="Seq1F1B-ZB: Seq1F1B with Zero Bubble's split backward (ZB-H1's shape over slices)",
               idle=forms.sliced(forms.zb_h1), memory=forms.seq1f1b_memory),
    ]
}


def names() -> list[str]:
    return list(FAMILIES)


def whole_names() -> tuple[str, ...]:
    """The families that run whole micro-batches: what the planners search when no family is named (a family of
    sequence slices at one slice is its plain family: seq1f1b is 1f1b, seq1f1b-zb is zb-h1)."""
    return tuple(n for n, f in FAMILIES.items() if not f.slices)


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ScheduleArgError(f"unknown schedule {name!r}; choose one of: {', '.join(FAMILIES)}") from None


def check_args(fam: Family, ranks: int, microbatches: int, chunks: int, slices: int = 1) -> None:
    """Raise ``ScheduleArgError`` naming the option and the rule it breaks."""
    for name, value in (("ranks", ranks), ("microbatches", microbatches), ("chunks", chunks), ("slices", slices)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ScheduleArgError(f"`{name}` must be a whole number; got {value!r} ({type(value).__name__})")
        if value < 1:
            raise ScheduleArgError(f"`{name}` must be >= 1; got {value}")
    if fam.chunks is not None and chunks not in fam.chunks:
        allowed = " or ".join(map(str, fam.chunks))
        raise ScheduleArgError(f"{fam.name} needs `chunks` {allowed}; got {chunks}")
    if slices != 1 and not fam.slices:
        sliced = ", ".join(f.name for f in FAMILIES.values() if f.slices)
        raise ScheduleArgError(f"{fam.name} does not cut micro-batches into sequence slices: `slices` 1 only; got "
                               f"{slices} (families with slices: {sliced})")
    if fam.even_ranks and ranks % 2:
        raise ScheduleArgError(f"{fam.name} needs an even `ranks`; got {ranks}")
    if fam.even_microbatches and microbatches % 2:
        raise ScheduleArgError(f"{fam.name} needs an even `microbatches`; got {microbatches}")
    low = fam.min_microbatches(ranks, chunks)
    if microbatches < low:
        raise ScheduleArgError(f"{fam.name} needs {fam.min_rule or f'`microbatches` >= {low}'} ({low}); got {microbatches}")


def generate(name: str, ranks: int, microbatches: int, chunks: int | None = None, slices: int = 1) -> Schedule:
    """The schedule of family ``name`` for ``ranks`` x ``microbatches`` (x ``chunks``), each micro-batch cut into
    ``slices`` sequence slices where the family has them (the schedule then counts m x slices units)."""
    fam = family(name)
    v = fam.default_chunks if chunks is None else chunks
    check_args(fam, ranks, microbatches, v, slices)
    if slices > 1:
        limits.MICROBATCHES.check(microbatches * slices, "", detail=f"-m {microbatches} x --slices {slices} units")
    limits.check_schedule_size(ranks, microbatches * slices, v, 3 if fam.split_backward else 2, name=fam.name)
    with gc_paused():
        if fam.slices:
            return fam.generator(ranks, microbatches, v, slices=slices)
        return fam.generator(ranks, microbatches, v)


