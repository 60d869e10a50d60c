"""The library's one error base, and how its messages name the user's arguments.

Every error that is the user's input (a bad option, file, value or size) is a ``StagewiseError``, so a
script can catch them all at once (``except stagewise.StagewiseError``) and the CLI prints them as one
line with exit code 2. A message names an argument in backticks, in the library's own words::

    `microbatches` 2: fewer than the 4 ranks of 1f1b; give microbatches >= 4

The Python API shows it as written; each front end says it in its own words with ``translate`` (the CLI
maps ``microbatches`` to ``-m``: flags.py), so one message serves both and neither names the other's
options. No torch here.

Example:
    >>> translate("`split` has 3 counts", {"split": "--split"})
    '--split has 3 counts'
    >>> translate("`split` has 3 counts", {})
    'split has 3 counts'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: a backticked argument name: `microbatches`, `model.layers_n`
ARG = re.compile(r"`([A-Za-z_][A-Za-z0-9_.]*)`")


class StagewiseError(ValueError):
    """Bad input from the user: the message names the argument (in backticks), the value and the rule."""


def translate(message: str, words: Mapping[str, str]) -> str:
    """``message`` with each backticked argument replaced by ``words[name]`` (the name itself if unmapped)."""
    return ARG.sub(lambda m: words.get(m[1], m[1]), message)
