"""The values a user types, read once: whole numbers, finite numbers, one value per stage, and the one error
for bad input (printed as one line, exit 2). Every subcommand's option groups build on these."""

from __future__ import annotations

import argparse
import math

from .errors import StagewiseError


class UsageError(StagewiseError):
    """Bad input from the user: printed as one line, exit code 2."""


def positive_int(text: str) -> int:
    """A whole number >= 1 (zero or a negative never means "the default")."""
    if len(text.strip()) > 18:  # int() of thousands of digits is slow, and no size here needs them
        raise argparse.ArgumentTypeError(f"expected a whole number of at most 18 digits; got {text[:24]!r}...")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def whole_int(text: str) -> int:
    """A whole number of at most 18 digits, of either sign: each option's own range is checked where it is used,
    in a message naming it (a 31-digit count must never reach a size computation in another option's words)."""
    if len(text.strip()) > 18:
        raise argparse.ArgumentTypeError(f"expected a whole number of at most 18 digits; got {text[:24]!r}...")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None


def finite_float(text: str) -> float:
    """A finite number (inf and nan would make every time and JSON output meaningless)."""
    value = _float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number; got {text!r}")
    return value


def _float(text: str) -> float:
    if len(text) > 64:
        raise argparse.ArgumentTypeError(f"expected a number of at most 64 characters; got {text[:24]!r}...")
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None


def per_stage_value(text: str):
    """'2' -> 2.0; '1,1,2' -> [1.0, 1.0, 2.0] (one value per stage)."""
    if len(text) > 1_000_000:
        raise argparse.ArgumentTypeError(f"a list of at most 1,000,000 characters; got {len(text)}")
    items = text.split(",")
    if any(len(x) > 64 for x in items):
        raise argparse.ArgumentTypeError("expected numbers of at most 64 characters each")
    try:
        parts = [float(x) for x in items]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number or comma-separated numbers per stage; got {text!r}") from None
    bad = [x for x in parts if not math.isfinite(x)]
    if bad:
        raise argparse.ArgumentTypeError(f"every value must be a finite number; got {bad[0]}")
    return parts[0] if len(parts) == 1 else parts
