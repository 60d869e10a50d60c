"""The one error type of the Hugging Face adapter (no torch, no transformers)."""

from __future__ import annotations

from .. import limits
from ..runtime.config import RunError


class HFError(RunError):
    """Bad input for the adapter (unsupported architecture, folder without weights, a split that does not fit).

    A ``RunError``: the message names the argument, file or config field, the value and the rule (library
    arguments in backticks, stagewise/errors.py); the CLI prints it in its own words, exit 2.
    """


def within(limit: limits.Limit, value: int, detail: str) -> None:
    """``limit.check`` whose refusal is an ``HFError`` (``detail``: the value, named as the user gave it).

    >>> within(limits.LAYERS, 200003, "num_hidden_layers 200000 makes 200003 layers")   # doctest: +SKIP
    HFError: num_hidden_layers 200000 makes 200003 layers: over the limit of 100000 layers; set ...
    """
    try:
        limit.check(value, "", detail=detail)
    except limits.LimitError as e:
        raise HFError(str(e)) from None
