"""Shared by tests/test_render_*.py: timelines of every family that exists."""

from __future__ import annotations

from stagewise.costs import Costs
from stagewise.schedules import FAMILIES, ScheduleArgError, generate
from stagewise.simulate import simulate
from stagewise.timeline import Timeline


def families(p: int = 4, m: int = 8) -> list[str]:
    """Families that are built and accept p, m (others are skipped, not failed)."""
    out = []
    for name in FAMILIES:
        try:
            generate(name, p, m)
        except (ScheduleArgError, ModuleNotFoundError):
            continue
        out.append(name)
    return out


def sim(name: str, p: int = 4, m: int = 8, v: int | None = None, **costs) -> Timeline:
    return simulate(generate(name, p, m, v), Costs(**costs))


def measured(tl: Timeline, offset: float = 1000.0, seconds_per_unit: float = 0.01) -> Timeline:
    """The same timeline as if measured: seconds, starting at an arbitrary clock value."""
    def conv(rows):
        return tuple(tuple(offset + x * seconds_per_unit for x in row) for row in rows)
    return Timeline(schedule=tl.schedule, starts=conv(tl.starts), ends=conv(tl.ends), source="measured",
                    unit="s", activation=tl.activation)
