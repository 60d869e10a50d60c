"""The cyclic garbage collector paused while a builder allocates: one job, for generators, the lowering and the
planner.

They allocate hundreds of thousands of small tuples and no cycles; the collector rescanning them as they pile
up made generation superlinear. Nested uses keep it off until the outermost ends.

Example:
    >>> with gc_paused():
    ...     programs = [tuple(range(3)) for _ in range(1000)]
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from collections.abc import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    """Keep the cyclic collector off inside the block (as it was again after the outermost one)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
