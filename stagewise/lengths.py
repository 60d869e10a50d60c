"""Micro-batches of different lengths: reading their lengths, ordering them, and what each one costs.

A step's micro-batches rarely hold the same number of tokens (documents of any length, packed or padded to
their own longest). Each costs what its length says: the per-action times in ``Costs`` (``t_f``, ``t_b``,
...) are those of a micro-batch of the *reference length* L0 (default: the mean of the lengths), and a
micro-batch of length L takes, on every duration,

    time factor        (1 - a) * (L / L0) + a * (L / L0) ** 2

where ``a`` (``attention_share``, 0 <= a < 1) is the share of a reference micro-batch's compute that is
attention's score and value products, quadratic in length; the rest (the projections, the MLP) is linear in
tokens. At L = L0 the factor is 1 whatever ``a`` is. Activations, boundary messages and all-to-all bytes
scale with tokens: ``L / L0``. These are ``Costs.mb_time`` and ``Costs.mb_activation`` (``apply``).

The order in which a step's micro-batches enter the pipeline is a choice (``ORDERS``): as given, longest
first or shortest first (sorted, the long ones meet at one end of the step instead of holding up its steady
state one by one), or balanced (longest, shortest, second longest, ... so no stretch of the step holds only
long ones). Which wins depends on the family and the lengths: the simulator says.
``stagewise simulate --order`` plays one, ``stagewise compare --order all`` each beside the others.

>>> factors([512, 1024, 2048], attention_share=0.25, reference=1024).time
(0.4375, 1.0, 2.5)
>>> ordered([3, 9, 1, 5], "balanced")
(9, 1, 5, 3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .costs import CostError, Costs
from .limits import MICROBATCHES, read_text

#: the order policies for a step's micro-batches of different lengths
ORDERS = ("as-given", "longest-first", "shortest-first", "balanced")


@dataclass(frozen=True)
class Factors:
    """Per micro-batch, the factor on its durations (``time``) and on its activation and bytes (``tokens``).

    ``squares`` (the mean of r^2 over its samples) and ``share`` (a) split ``time`` into its linear and its
    attention part, which ``units`` deals over a micro-batch's Seq1F1B slices."""

    time: tuple[float, ...]
    tokens: tuple[float, ...]
    squares: tuple[float, ...] = ()
    share: float = 0.0

    def units(self, slices: int = 1) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(time, tokens) per pipeline unit: each micro-batch's ``slices`` slices in turn. A slice holds 1/k of
        its tokens; causal attention makes slice j attend to j + 1 slices of keys, so its attention part is
        (2j + 1) / k of the micro-batch's mean (the slices' times average to ``time``)."""
        if slices == 1:
            return self.time, self.tokens
        a = self.share
        time = tuple((1 - a) * r + a * q * (2 * j + 1) / slices
                     for r, q in zip(self.tokens, self.squares) for j in range(slices))
        return time, tuple(r for r in self.tokens for _ in range(slices))


def parse(text: str, option: str = "`lengths`") -> tuple[int, ...]:
    """Lengths from text: one whole number per line (blank lines and ``#`` comments skipped) or a JSON list."""
    body = text.strip()
    if body.startswith("["):
        import json  # only for a JSON list: `stagewise simulate`'s start-up loads no json

        try:
            values = json.loads(body)
        except json.JSONDecodeError as e:
            raise CostError(f"{option}: not a JSON list of lengths ({e.msg} at line {e.lineno})") from None
        except (ValueError, RecursionError):  # a number of more digits than int() takes, or nested too deeply
            raise CostError(f"{option}: not a JSON list of whole numbers this reader accepts") from None
        where = [f"item {k}" for k in range(len(values))]
    else:
        lines = [(n, line.split("#", 1)[0].strip()) for n, line in enumerate(text.splitlines(), 1)]
        values = [x for _, x in lines if x]
        where = [f"line {n}" for n, x in lines if x]
    if not values:
        raise CostError(f"{option}: no lengths; give one whole number >= 1 per micro-batch (one a line, or a JSON "
                        "list)")
    MICROBATCHES.check(len(values), option, detail=f"{option}: {len(values)} lengths (one per micro-batch)")
    out = []
    for x, at in zip(values, where):
        n = _whole(x)
        if n is None or n < 1:
            raise CostError(f"{option}: {at} is {x!r}; every length must be a whole number >= 1 (tokens)")
        out.append(n)
    return tuple(out)


def _whole(x) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, str) and x.isascii() and x.isdigit() and len(x) <= 18:
        return int(x)
    return None


def read(path, option: str = "`lengths`") -> tuple[int, ...]:
    """The lengths in file ``path`` (bounded by ``limits.FILE_BYTES`` and ``limits.MICROBATCHES``)."""
    return parse(read_text(path, f"{option}"), f"{option} {path}")


def ordered(lengths: Sequence[int], policy: str = "as-given") -> tuple[int, ...]:
    """``lengths`` in the order ``policy`` (one of ``ORDERS``) feeds them to the pipeline."""
    xs = tuple(lengths)
    if policy == "as-given":
        return xs
    if policy == "longest-first":
        return tuple(sorted(xs, reverse=True))
    if policy == "shortest-first":
        return tuple(sorted(xs))
    if policy == "balanced":
        down, out = sorted(xs, reverse=True), []
        lo, hi = 0, len(down) - 1
        while lo <= hi:
            out.append(down[lo])
            if lo != hi:
                out.append(down[hi])
            lo, hi = lo + 1, hi - 1
        return tuple(out)
    raise CostError(f"`order` {policy!r}: choose one of {', '.join(ORDERS)}")


def factors(lengths: Sequence[int], attention_share: float = 0.0, reference: float | None = None) -> Factors:
    """Each length's time factor ``(1 - a) r + a r^2`` and token factor ``r``, with ``r = L / reference``
    (default reference: the mean length) and ``a = attention_share``."""
    if not (isinstance(attention_share, (int, float)) and 0 <= attention_share < 1):
        raise CostError(f"`attention_share` {attention_share}: must be a number >= 0 and < 1 (the share of a "
                        "reference micro-batch's compute that grows with the square of its length)")
    if not lengths:
        raise CostError("`lengths`: give at least one length")
    ref = sum(lengths) / len(lengths) if reference is None else reference
    if not (isinstance(ref, (int, float)) and 0 < ref < math.inf):
        raise CostError(f"`reference_length` {reference}: must be a number > 0 (tokens)")
    r = [x / ref for x in lengths]
    a = float(attention_share)
    return Factors(time=tuple((1 - a) * x + a * (x * x) for x in r), tokens=tuple(r), squares=tuple(x * x for x in r),
                   share=a)


def apply(costs: Costs, lengths: Sequence[int], *, microbatches: int | None = None, slices: int = 1,
          attention_share: float = 0.0, reference: float | None = None, order: str = "as-given") -> Costs:
    """``costs`` whose micro-batches have ``lengths`` (one per micro-batch, checked against ``microbatches``
    when given), fed in ``order``: their factors as ``Costs.mb_time`` and ``mb_activation``, each micro-batch's
    dealt over its ``slices`` pipeline units (``Factors.units``, ``stagewise.slices``)."""
    if microbatches is not None and len(lengths) != microbatches:
        raise CostError(f"`lengths` has {len(lengths)} lengths; the step has {microbatches} micro-batches "
                        f"(`microbatches`): give one length per micro-batch")
    time, tokens = factors(ordered(lengths, order), attention_share, reference).units(slices)
    return replace(costs, mb_time=time, mb_activation=tokens)


@dataclass(frozen=True)
class Distribution:
    """A length distribution to plan for (``stagewise plan --lengths``): sample lengths as the data gives them.

    A step of ``m`` micro-batches of ``size`` samples takes ``m * size`` of its lengths at evenly spaced
    quantiles (every part of the distribution, long tail included, in its share), in one fixed shuffled order
    (``seed``: as a data loader deals them, the same for every configuration compared); a micro-batch costs
    the mean of its samples' factors (``factors``, at ``reference``: default the distribution's mean, the
    length the profile's times describe)."""

    lengths: tuple[int, ...]
    attention_share: float = 0.0
    reference: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        factors(self.lengths[:1] or (1,), self.attention_share, self.reference)  # the same checks, said once

    @property
    def mean(self) -> float:
        return sum(self.lengths) / len(self.lengths)

    def microbatches(self, m: int, size: int = 1) -> tuple[tuple[int, ...], ...]:
        """``m`` micro-batches of ``size`` sample lengths each, drawn as the class says."""
        import random

        xs, count = sorted(self.lengths), m * size
        picks = [xs[min(len(xs) - 1, int((k + 0.5) * len(xs) / count))] for k in range(count)]
        random.Random(self.seed).shuffle(picks)
        return tuple(tuple(picks[i * size:(i + 1) * size]) for i in range(m))

    def factors(self, m: int, size: int = 1) -> Factors:
        """Per micro-batch of ``microbatches(m, size)``, the mean of its samples' time and token factors."""
        ref = self.mean if self.reference is None else self.reference
        out = [factors(g, self.attention_share, ref) for g in self.microbatches(m, size)]
        return Factors(time=tuple(sum(f.time) / size for f in out), tokens=tuple(sum(f.tokens) / size for f in out),
                       squares=tuple(sum(f.squares) / size for f in out), share=float(self.attention_share))

    def apply(self, costs: Costs, m: int, size: int = 1, slices: int = 1) -> Costs:
        """``costs`` (of one micro-batch of ``size`` samples at the reference length) for a step of ``m``."""
        time, tokens = self.factors(m, size).units(slices)
        return replace(costs, mb_time=time, mb_activation=tokens)

    def to_dict(self) -> dict:
        return {"samples": len(self.lengths), "min": min(self.lengths), "max": max(self.lengths), "mean": self.mean,
                "attention_share": self.attention_share, "reference_length": self.reference or self.mean}


def describe(lengths: Sequence[int], attention_share: float = 0.0, reference: float | None = None) -> str:
    """One line on a step's lengths: their spread and the slowest micro-batch's time factor."""
    f = factors(lengths, attention_share, reference)
    k = max(range(len(lengths)), key=f.time.__getitem__)
    return (f"{len(lengths)} micro-batches of {min(lengths)}..{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.4g}); "
            f"the longest takes x{f.time[k]:.3g} of a reference micro-batch's time (attention share {attention_share:g})")
