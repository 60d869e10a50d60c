"""A split of a model's layers into stages (``Split``) and its layout text, in a form people can read and type.

Vocabulary, one meaning each: a *split* is the layers per stage of one model
copy (``Split``: counts, ranges and text are three views of it); a *layout*
is a split's text; *partition* is the planner's search for a split (plan/search/partition.py);
a *chunk* is one of a rank's stages (``-v``). No torch here: the runtime
(``Pipeline(split=...)``, ``train --split``) and the planner share this value.

A layout's text names each
layer by its symbol (``E`` embedding, ``t`` transformer block, ``H`` head, or
what a profile says) and collapses runs: ``E+t*7 | t*8 | t*8 | t*7+H``.
Parsing checks the text against the model's own sequence of symbols, so a
layout that loses, duplicates or reorders a layer is rejected with the stage
and layer where it goes wrong.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from itertools import accumulate, groupby
from typing import Sequence

from .errors import StagewiseError

_TERM_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)(?:\s*\*\s*([0-9]+))?")


class LayoutError(StagewiseError):
    """A layout string that does not describe the model's layers exactly once, in order."""


@dataclass(frozen=True)
class Split:
    """Layers per stage of one model copy, in model order: counts, ranges and layout text as one value.

    >>> s = Split.parse("E+t*3 | t*3+H", ["E"] + ["t"] * 6 + ["H"])
    >>> s.counts, s.ranges[1], s.text(["E"] + ["t"] * 6 + ["H"]), str(s)
    ((4, 4), range(4, 8), 'E+t*3 | t*3+H', '4,4')
    """

    counts: tuple[int, ...]  #: layers of each stage, >= 1 each

    def __post_init__(self):
        object.__setattr__(self, "counts", tuple(int(c) for c in self.counts))
        bad = [c for c in self.counts if c < 1]
        if not self.counts or bad:
            raise LayoutError(f"{self}: every stage needs at least one layer")

    @classmethod
    def even(cls, layers: int, stages: int) -> "Split":
        """``layers`` over ``stages`` as evenly as can be, earlier stages taking the extra layers."""
        q, r = divmod(layers, stages)
        return cls(tuple(q + (k < r) for k in range(stages)))

    @classmethod
    def parse(cls, text: str, symbols: Sequence[str] | int) -> "Split":
        """``3,2,2,3`` (counts) or a layout ``E+t*3 | t*3+H``, checked against the model's ``symbols`` (or, when
        only its number of layers is known, that the counts add up to it)."""
        if _COUNTS_RE.fullmatch(text):
            out = cls(tuple(int(c) for c in text.split(",")))
            layers = symbols if isinstance(symbols, int) else len(symbols)
            if out.layers != layers:
                raise LayoutError(f"{text!r} covers {out.layers} layers; the model has {layers}")
            return out
        if isinstance(symbols, int):
            return cls(stage_counts(text, symbols))
        return cls(parse_layout(text, symbols))

    @property
    def stages(self) -> int:
        return len(self.counts)

    @property
    def layers(self) -> int:
        return sum(self.counts)

    @property
    def ranges(self) -> tuple[range, ...]:
        """Each stage's layer indices."""
        ends = list(accumulate(self.counts))
        return tuple(range(e - c, e) for c, e in zip(self.counts, ends))

    def text(self, symbols: Sequence[str], *, abbreviate: bool = False) -> str:
        """The layout text over the model's ``symbols``, e.g. ``E+t*7 | t*8 | t*7+H``."""
        return format_layout(symbols, self.counts, abbreviate=abbreviate)

    def __str__(self) -> str:
        return ",".join(map(str, self.counts))


_COUNTS_RE = re.compile(r"\s*[0-9]+\s*(,\s*[0-9]+\s*)*")


def format_layout(symbols: Sequence[str], counts: Sequence[int], *, abbreviate: bool = False) -> str:
    """``E+t*7 | t*8 | t*7+H`` for ``counts`` layers per stage over ``symbols``.

    With ``abbreviate`` the middle of a long layout becomes ``...`` (tables).
    """
    if sum(counts) != len(symbols):
        raise LayoutError(f"counts {list(counts)} cover {sum(counts)} layers; the model has {len(symbols)}")
    stages, lo = [], 0
    for n in counts:
        stages.append(_stage_text(symbols[lo:lo + n]))
        lo += n
    if abbreviate and len(stages) > 4:
        stages = stages[:2] + ["..."] + stages[-1:]
    return " | ".join(stages)


def _stage_text(symbols: Sequence[str]) -> str:
    runs = [(sym, len(list(grp))) for sym, grp in groupby(symbols)]
    return "+".join(sym if n == 1 else f"{sym}*{n}" for sym, n in runs)


def parse_layout(text: str, symbols: Sequence[str]) -> tuple[int, ...]:
    """Layers per stage of ``text``; raises ``LayoutError`` unless it covers ``symbols`` exactly, in order."""
    stage_syms = _stages(text, len(symbols), summary(symbols))
    got = [s for stage in stage_syms for s in stage]
    if Counter(got) != Counter(symbols):
        raise LayoutError(f"`layout` {text!r} {_count_problem(got, symbols)}; the model is {summary(symbols)}")
    pos = 0
    for k, stage in enumerate(stage_syms):
        for sym in stage:
            if sym != symbols[pos]:
                raise LayoutError(f"`layout` {text!r}: stage {k} has {sym} where the model has {symbols[pos]} "
                                  f"(layer {pos}); the model is {summary(symbols)}")
            pos += 1
    return tuple(len(stage) for stage in stage_syms)


def stage_counts(text: str, layers: int) -> tuple[int, ...]:
    """Layers per stage of ``text`` for a model of ``layers`` layers whose symbols are not known here (the runtime
    names its layers itself); raises ``LayoutError`` if the counts do not add up to ``layers``.

    >>> stage_counts("E+t*3 | t*3+H", 8)
    (4, 4)
    """
    counts = tuple(len(stage) for stage in _stages(text, layers, f"{layers} layers"))
    if sum(counts) != layers:
        raise LayoutError(f"{text!r} has {sum(counts)} layers; the model has {layers}")
    return counts


def _stages(text: str, layers: int, model: str) -> list[list[str]]:
    """Each stage's symbols, expanded only while they fit: 't*1000000000' allocates nothing (the slack lets a
    layout a few layers off still get its diagnosis from the caller)."""
    stage_syms: list[list[str]] = []
    room = 2 * layers + 8
    for k, part in enumerate(text.split("|")):
        if k >= room:
            raise LayoutError(f"`layout` has more than {room} stages; the model is {model}")
        stage_syms.append(_parse_stage(part, k, room, layers))
        room -= len(stage_syms[-1])
    return stage_syms


def _parse_stage(part: str, k: int, room: int, layers: int) -> list[str]:
    part = part.strip()
    if part == "...":
        raise LayoutError(f"`layout` stage {k} is '...', an abbreviation in tables; write every stage")
    if not part:
        raise LayoutError(f"`layout` stage {k} is empty; every stage needs at least one layer")
    out: list[str] = []
    for term in part.split("+"):
        m = _TERM_RE.fullmatch(term.strip())
        if not m:
            raise LayoutError(f"`layout` stage {k}: {term.strip()!r} is not SYMBOL or SYMBOL*COUNT (e.g. t*8)")
        n = int(m[2]) if m[2] is not None and len(m[2]) <= 9 else 1 if m[2] is None else room + 1
        if n < 1:
            raise LayoutError(f"`layout` stage {k}: {term.strip()!r} has count 0; drop the term instead")
        if len(out) + n > room:
            raise LayoutError(f"`layout` stage {k}: {term.strip()[:40]!r} goes far past the model's {layers} layers")
        out += [m[1]] * n
    return out


def _count_problem(got: Sequence[str], symbols: Sequence[str]) -> str:
    want, have = Counter(symbols), Counter(got)
    lost = want - have
    dup = have - want
    parts = []
    if lost:
        parts.append("loses " + ", ".join(f"{n} {s}" for s, n in lost.items()))
    if dup:
        extra = [s for s in dup if s in want]
        unknown = [s for s in dup if s not in want]
        if extra:
            parts.append("duplicates " + ", ".join(f"{dup[s]} {s}" for s in extra))
        if unknown:
            parts.append("names unknown layer symbol " + ", ".join(repr(s) for s in unknown))
    return f"has {len(got)} layers and " + " and ".join(parts)


def summary(symbols: Sequence[str]) -> str:
    """``E, t*32, H``: the model's layer sequence in short."""
    return _stage_text(symbols).replace("+", ", ")
