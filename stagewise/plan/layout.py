"""Layout strings: which layers each stage holds, in a form people can read and type.

A layout is a count of layers per stage, in model order. Its text names each
layer by its symbol (``E`` embedding, ``t`` transformer block, ``H`` head, or
what a profile says) and collapses runs: ``E+t*7 | t*8 | t*8 | t*7+H``.
Parsing checks the text against the model's own sequence of symbols, so a
layout that loses, duplicates or reorders a layer is rejected with the stage
and layer where it goes wrong.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import groupby
from typing import Sequence

from .errors import PlanError

_TERM_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)(?:\s*\*\s*(\d+))?")


class LayoutError(PlanError):
    """A layout string that does not describe the model's layers exactly once, in order."""


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
        raise LayoutError(f"--layout {text!r} {_count_problem(got, symbols)}; the model is {summary(symbols)}")
    pos = 0
    for k, stage in enumerate(stage_syms):
        for sym in stage:
            if sym != symbols[pos]:
                raise LayoutError(f"--layout {text!r}: stage {k} has {sym} where the model has {symbols[pos]} "
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
            raise LayoutError(f"--layout has more than {room} stages; the model is {model}")
        stage_syms.append(_parse_stage(part, k, room, layers))
        room -= len(stage_syms[-1])
    return stage_syms


def _parse_stage(part: str, k: int, room: int, layers: int) -> list[str]:
    part = part.strip()
    if part == "...":
        raise LayoutError(f"--layout stage {k} is '...', an abbreviation in tables; write every stage")
    if not part:
        raise LayoutError(f"--layout stage {k} is empty; every stage needs at least one layer")
    out: list[str] = []
    for term in part.split("+"):
        m = _TERM_RE.fullmatch(term.strip())
        if not m:
            raise LayoutError(f"--layout stage {k}: {term.strip()!r} is not SYMBOL or SYMBOL*COUNT (e.g. t*8)")
        n = int(m[2]) if m[2] is not None and len(m[2]) <= 9 else 1 if m[2] is None else room + 1
        if n < 1:
            raise LayoutError(f"--layout stage {k}: {term.strip()!r} has count 0; drop the term instead")
        if len(out) + n > room:
            raise LayoutError(f"--layout stage {k}: {term.strip()[:40]!r} goes far past the model's {layers} layers")
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
