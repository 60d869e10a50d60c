"""Jupyter display as a hook: ``Schedule`` and ``Timeline`` hand themselves to ``draw``, and the drawing is
registered here by ``stagewise.notebook``, so the core never imports its view (no circle through it).

The package's ``__init__`` names the loader (it imports the notebook module), which runs on the first
display and not before: ``import stagewise`` loads no drawing code.
"""

from __future__ import annotations

from collections.abc import Callable

_drawers: dict[tuple[type, str], Callable] = {}
_load: list[Callable[[], object]] = []


def register(cls: type, **drawers: Callable) -> None:
    """How ``cls`` draws itself, by form: ``html`` (a page fragment), ``svg`` (a picture, or None)."""
    _drawers.update({(cls, form): draw for form, draw in drawers.items()})


def loads_with(load: Callable[[], object]) -> None:
    """The call that registers the drawers, made on the first display."""
    _load[:] = [load]


def draw(obj, form: str):
    if (type(obj), form) not in _drawers:
        for load in _load:
            load()
    return _drawers[(type(obj), form)](obj)
