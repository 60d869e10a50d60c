"""Model and hardware description files: a shipped name or a path, read strictly.

A file is JSON with ``"format"`` and ``"version"``; every field is checked and a
bad one is named with its file, its value and the rule it breaks, so the CLI can
print one line and exit 2.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .errors import PlanError


class SpecError(PlanError):
    """A model or hardware file that cannot be used (the message names file, field, value and rule)."""


def shipped(kind: str) -> list[str]:
    """Names of the files shipped in stagewise/plan/data/<kind>/ (``models`` or ``hardware``)."""
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
        if not path.is_file():
            raise SpecError(f"{option} {ref!r}: no such file and not a shipped name; shipped: "
                            f"{', '.join(shipped(kind))}")
        try:
            text = path.read_text()
        except OSError as e:
            raise SpecError(f"{option} {ref}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{where}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise SpecError(f"{where}: not a {kind} file (needs \"format\": \"{fmt}\")")
    if data.get("version") != 1:
        raise SpecError(f"{where}: version {data.get('version')!r}; this stagewise reads version 1")
    return data, where


def number(data: dict, key: str, where: str, *, positive: bool = True, integer: bool = False,
           maximum: float | None = None) -> float:
    """A required finite number field; ``positive`` means > 0 (else >= 0)."""
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
        raise SpecError(f"{where}: {key} must be <= {maximum:g}; got {v!r}")
    return int(v) if integer else float(v)


def whole(data: dict, key: str, where: str, *, default: int) -> int:
    """An optional whole number >= 0 field (``default`` when absent)."""
    return number(data, key, where, positive=False, integer=True) if key in data else default


def flag(data: dict, key: str, where: str) -> bool:
    if key not in data:
        raise SpecError(f"{where} lacks the field {key!r}")
    if not isinstance(data[key], bool):
        raise SpecError(f"{where}: {key} must be true or false; got {data[key]!r}")
    return data[key]
