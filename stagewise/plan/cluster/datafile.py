"""Model and hardware description files: a shipped name or a path, read strictly.

A file is JSON with ``"format"`` and ``"version"``; every field is checked and a
bad one is named with its file, its value and the rule it breaks, so the CLI can
print one line and exit 2.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

from ... import limits
from ..errors import PlanError


class SpecError(PlanError):
    """A model or hardware file that cannot be used (the message names file, field, value and rule)."""


def shipped(kind: str) -> list[str]:
    """Names of the files shipped in stagewise/plan/cluster/data/<kind>/ (``models`` or ``hardware``)."""
    folder = resources.files(__package__).joinpath("data", kind)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def read(ref: str, kind: str, option: str, fmt: str) -> tuple[dict, str]:
    """(parsed JSON, where it came from) for a shipped name or a path; checks format and version."""
    if ref in shipped(kind):
        where = f"{option} {ref}"
        text = resources.files(__package__).joinpath("data", kind, f"{ref}.json").read_text()
    else:
        where = f"{option} {ref}"
        path = Path(ref)
        if not path.exists():
            raise SpecError(f"{option} {ref!r}: no such file and not a shipped name; shipped: "
                            f"{', '.join(shipped(kind))}")
        try:  # a regular UTF-8 file of bounded size (no FIFO, device or folder)
            text = limits.read_text(path, option)
        except limits.LimitError as e:
            raise SpecError(str(e)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{where}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise SpecError(f"{where}: not JSON this reader accepts: nested too deeply") from None
    except ValueError:  # int() refuses more than 4,300 digits
        raise SpecError(f"{where}: not JSON this reader accepts: a number of more than "
                        f"{sys.get_int_max_str_digits()} digits") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise SpecError(f"{where}: not a {kind} file (needs \"format\": \"{fmt}\")")
    if data.get("version") != 1:
        raise SpecError(f"{where}: version {data.get('version')!r}; this stagewise reads version 1")
    return data, where


def number(data: dict, key: str, where: str, *, positive: bool = True, integer: bool = False,
           maximum: float | None = None, minimum: float | None = None, unit: str = "") -> float:
    """A required finite number field; ``positive`` means > 0 (else >= 0); ``minimum`` and ``maximum``
    bound it (a physical range: a GPU of 1e-300 FLOP/s is no GPU, and its times would overflow)."""
    if key not in data:
        raise SpecError(f"{where} lacks the field {key!r}")
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise SpecError(f"{where}: {key} must be a finite number; got {v!r}")
    if integer and v != int(v):
        raise SpecError(f"{where}: {key} must be a whole number; got {v!r}")
    if positive and not v > 0:
        raise SpecError(f"{where}: {key} must be > 0; got {v!r}")
    if not positive and v < 0:
        raise SpecError(f"{where}: {key} must be >= 0; got {v!r}")
    if maximum is not None and v > maximum:
        raise SpecError(f"{where}: {key} must be <= {maximum:g}{unit}; got {v!r}")
    if minimum is not None and v < minimum:
        raise SpecError(f"{where}: {key} must be >= {minimum:g}{unit}; got {v!r}")
    return int(v) if integer else float(v)


def sources(data: dict, where: str) -> dict:
    """The optional ``sources`` object: field -> where its number comes from (text)."""
    raw = data.get("sources", {})
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise SpecError(f"{where}: sources must be an object of texts naming where each number comes from, "
                        f"e.g. {{\"peak_flops\": \"NVIDIA H100 datasheet\"}}; got {str(raw)[:60]!r}")
    return dict(raw)


def label(data: dict, key: str, where: str, default: str) -> str:
    """An optional text field (a name), at most 200 characters."""
    v = data.get(key, default)
    if not isinstance(v, str) or len(v) > 200:
        raise SpecError(f"{where}: {key} must be a text of at most 200 characters; got {str(v)[:60]!r}")
    return v


def whole(data: dict, key: str, where: str, *, default: int, maximum: float | None = None) -> int:
    """An optional whole number >= 0 field, at most ``maximum`` (``default`` when absent)."""
    return number(data, key, where, positive=False, integer=True, maximum=maximum) if key in data else default


def flag(data: dict, key: str, where: str) -> bool:
    if key not in data:
        raise SpecError(f"{where} lacks the field {key!r}")
    if not isinstance(data[key], bool):
        raise SpecError(f"{where}: {key} must be true or false; got {data[key]!r}")
    return data[key]
