"""Strict JSON for every output: no NaN or Infinity, which browsers and most parsers reject.

Inputs are checked to be finite where they are read (costs, latencies), but a
sum of large finite numbers can still overflow; ``finite`` turns any float
that is not finite into ``null`` so that the output always parses, and
``dumps`` is the one place outputs are serialised (CLI ``--json``, the
workshop API, the demo's JSON, Chrome traces, profiles).

Example:
    >>> dumps({"makespan": float("inf"), "busy": [1.0, float("nan")]})
    '{"makespan": null, "busy": [1.0, null]}'
"""

from __future__ import annotations

import json
import math


def finite(obj):
    """``obj`` with every non-finite float replaced by None (dicts, lists and tuples walked)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj, **kw) -> str:
    """``json.dumps`` of ``finite(obj)`` with ``allow_nan=False``."""
    try:  # nearly always all finite: skip the walk (a third of the workshop's answer time at p=16, m=64)
        return json.dumps(obj, allow_nan=False, **kw)
    except ValueError:  # a NaN or infinity somewhere (json raises before writing anything)
        return json.dumps(finite(obj), allow_nan=False, **kw)


def dump(obj, fh, **kw) -> None:
    """``dumps`` into an open text file."""
    fh.write(dumps(obj, **kw))
