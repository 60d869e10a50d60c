"""A packing plan: documents of any length into rows of a token budget, rows balanced across ranks and
micro-batches. Pure Python (no torch): the planner's side of packing, the tensors are ``tensors.py``'s.

The rule, in two parts:

- **rows**: first-fit-decreasing. Documents are taken longest first (ties by their order) and each goes into
  the first row with room for it, else a new row; each row is ``budget`` tokens, the rest padding. A document
  longer than ``budget`` is an error, or with ``split=True`` is cut into pieces of ``budget`` tokens (the last
  shorter), each its own document.
- **balance**: the rows are dealt to the ``ranks`` data-parallel ranks, then each rank's to its
  ``microbatches`` micro-batches, each time heaviest row first to the lightest holder that has a free place
  (every holder takes the same number of rows). So the ranks' tokens differ by at most one row's
  (``budget``), and so do one rank's micro-batches.

A plan lists its rows in the order a step's batch is cut: rank 0's micro-batch 0 first, then its
micro-batch 1, ..., then rank 1's (``Pipeline.step`` cuts dimension 0 into ``dp`` shares, then each into
``microbatches`` pieces).

>>> p = pack([5, 3, 7, 2, 8], budget=8, ranks=1, microbatches=2)
>>> [row.lengths for row in p.rows]
[(8,), (7,), (5, 3), (2,)]
>>> [row.lengths for row in p.group(0, 0)], [row.lengths for row in p.group(0, 1)]
([(8,), (7,)], [(5, 3), (2,)])
>>> p.tokens, p.slots, round(p.padding_fraction, 3)
(25, 32, 0.219)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import StagewiseError


class DataError(StagewiseError):
    """Bad input to the packer (the message names the argument, the value and the rule)."""


@dataclass(frozen=True)
class Row:
    """One row of a packed micro-batch: documents one after another, then padding up to the budget.

    >>> Row(documents=(4, 0), lengths=(6, 2)).tokens
    8
    """

    documents: tuple[int, ...]  #: each document's index in the lengths packed (a piece of a split one: its own)
    lengths: tuple[int, ...]  #: each document's tokens, in the row's order

    @property
    def tokens(self) -> int:
        """Real (non-padding) tokens."""
        return sum(self.lengths)


@dataclass(frozen=True, kw_only=True)
class Packing:
    """A step's plan: ``rows`` (rank by rank, micro-batch by micro-batch), each ``budget`` tokens long.

    >>> p = pack([3, 3, 3, 3], budget=6, ranks=2)
    >>> [g.tokens for g in p.rows], p.rank_tokens()
    ([6, 6], (6, 6))
    """

    budget: int  #: tokens per row (the sequence length every row is padded to)
    ranks: int  #: data-parallel ranks the rows are dealt to
    microbatches: int  #: micro-batches on each rank
    rows: tuple[Row, ...]  #: ranks x microbatches x rows_per_microbatch rows, in the order a batch is cut
    #: the document each split piece came from (index in the lengths given), for ``split=True``; else None
    sources: tuple[int, ...] | None = None

    @property
    def rows_per_microbatch(self) -> int:
        return len(self.rows) // (self.ranks * self.microbatches)

    @property
    def tokens(self) -> int:
        """Real tokens in the step."""
        return sum(r.tokens for r in self.rows)

    @property
    def slots(self) -> int:
        """Token places in the step: rows x budget."""
        return len(self.rows) * self.budget

    @property
    def padding_fraction(self) -> float:
        """Padding over all token places (0.0 for an empty plan)."""
        return 1.0 - self.tokens / self.slots if self.slots else 0.0

    def group(self, rank: int, microbatch: int) -> tuple[Row, ...]:
        """The rows of ``rank``'s micro-batch ``microbatch``."""
        per = self.rows_per_microbatch
        first = (rank * self.microbatches + microbatch) * per
        return self.rows[first:first + per]

    def microbatch_tokens(self) -> tuple[tuple[int, ...], ...]:
        """Per rank, each micro-batch's real tokens."""
        return tuple(tuple(sum(r.tokens for r in self.group(k, i)) for i in range(self.microbatches))
                     for k in range(self.ranks))

    def rank_tokens(self) -> tuple[int, ...]:
        """Each rank's real tokens."""
        return tuple(sum(t) for t in self.microbatch_tokens())


def _count(name: str, value, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise DataError(f"`{name}` {value!r}: must be a whole number >= {low}")
    return value


def _pieces(lengths: Sequence[int], budget: int, split: bool, argument: str) -> tuple[list[int], list[int]]:
    """(lengths, source of each): each document checked, a long one cut when ``split``."""
    out, src = [], []
    for i, n in enumerate(lengths):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise DataError(f"`lengths` item {i} is {n!r}: a document's length must be a whole number >= 1")
        if n > budget and not split:
            raise DataError(f"`{argument}` {budget}: document {i} has {n} tokens; every document must fit in one "
                            f"row of `{argument}` tokens (give a larger `{argument}`, or split=True to cut long "
                            f"documents into pieces)")
        for start in range(0, n, budget):
            out.append(min(budget, n - start))
            src.append(i)
    return out, src


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Rows of document indices: longest first, each into the first row with room (lengths <= budget).

    >>> first_fit_decreasing([2, 5, 4, 3], 7)
    [[1, 0], [2, 3]]
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(budget - lengths[i])
    return rows


def _deal(rows: list[Row], holders: int) -> list[list[Row]]:
    """``rows`` dealt to ``holders`` equal shares: heaviest first, to the lightest holder with a free place."""
    per = len(rows) // holders
    shares: list[list[Row]] = [[] for _ in range(holders)]
    load = [0] * holders
    for row in sorted(rows, key=lambda r: -r.tokens):
        h = min((h for h in range(holders) if len(shares[h]) < per), key=lambda h: (load[h], h))
        shares[h].append(row)
        load[h] += row.tokens
    return shares


def fitting(lengths: Sequence[int], budget: int, rows: int) -> int:
    """How many of ``lengths``, from the first, first-fit-decreasing packs into ``rows`` rows of ``budget``
    (documents longer than ``budget`` count as not fitting): a step takes that many of a document stream.

    >>> fitting([4, 4, 4, 3, 1], budget=8, rows=2)
    5
    >>> fitting([6, 6, 6], budget=8, rows=2)
    2
    """
    lo, hi = 0, len(lengths)  # fits(lo) holds; find the largest k that fits (fitting is monotone in k)
    while lo < hi:
        k = (lo + hi + 1) // 2
        head = list(lengths[:k])
        if max(head) <= budget and len(first_fit_decreasing(head, budget)) <= rows:
            lo = k
        else:
            hi = k - 1
    return lo


def pack(lengths: Sequence[int], budget: int, *, ranks: int = 1, microbatches: int = 1, rows: int | None = None,
         split: bool = False, argument: str = "budget") -> Packing:
    """Plan a step: ``lengths`` (tokens per document) into rows of ``budget`` tokens, dealt to ``ranks`` x
    ``microbatches``. ``rows``: the step's rows (a multiple of ranks x microbatches; the documents must fit in
    them); None: as many as first-fit-decreasing needs, rounded up to that multiple with empty rows.
    ``argument`` names the budget in errors (the CLI's ``seq``).

    >>> pack([9], budget=8)
    Traceback (most recent call last):
    ...
    stagewise.data.packing.DataError: `budget` 8: document 0 has 9 tokens; every document must fit in one row of `budget` tokens (give a larger `budget`, or split=True to cut long documents into pieces)
    >>> [r.lengths for r in pack([9], budget=8, split=True).rows]
    [(8,), (1,)]
    """
    _count(argument, budget)
    _count("ranks", ranks)
    _count("microbatches", microbatches)
    pieces, sources = _pieces(lengths, budget, split, argument)
    made = [Row(documents=tuple(d), lengths=tuple(pieces[i] for i in d))
            for d in first_fit_decreasing(pieces, budget)]
    groups = ranks * microbatches
    if rows is None:
        rows = max(groups, -(-len(made) // groups) * groups)
    _count("rows", rows)
    if rows % groups:
        raise DataError(f"`rows` {rows}: must split into `ranks` {ranks} x `microbatches` {microbatches} equal "
                        f"shares; give a multiple of {groups}")
    if len(made) > rows:
        raise DataError(f"`rows` {rows}: the documents need {len(made)} rows of `{argument}` {budget} tokens; "
                        f"give fewer documents (`fitting` says how many fit) or more rows")
    made += [Row(documents=(), lengths=())] * (rows - len(made))
    ordered = [row for share in _deal(made, ranks) for mb in _deal(share, microbatches) for row in mb]
    return Packing(budget=budget, ranks=ranks, microbatches=microbatches, rows=tuple(ordered),
                   sources=tuple(sources) if split else None)
