"""The one error type of the Hugging Face adapter (no torch, no transformers)."""

from __future__ import annotations

from ..runtime.run.config import RunError


class HFError(RunError):
    """Bad input for the adapter (unsupported architecture, folder without weights, a split that does not fit).

    A ``RunError``: the message names the option or file, the value and the rule; the CLI prints it, exit 2.
    """
