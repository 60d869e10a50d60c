"""Schedule generators, one module per family, and the registry that names them."""

from .registry import FAMILIES, ScheduleArgError, family, generate, names

__all__ = ["FAMILIES", "ScheduleArgError", "family", "generate", "names"]
