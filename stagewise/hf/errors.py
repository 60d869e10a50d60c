"""The one error type of the Hugging Face adapter (no torch, no transformers)."""

from __future__ import annotations


class HFError(ValueError):
    """Bad input for the adapter (unsupported architecture, folder without weights, a split that does not fit).

    The message names the option or file, the value and the rule; the CLI prints it as one line, exit 2.
    """
