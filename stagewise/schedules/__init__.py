"""Schedule generators, one pure module per family, and the registry that names them with their argument
rules, closed forms and memory (``registry.FAMILIES``); ``generate`` checks the rules, then calls the
family's generator. No torch.

May import: the core.
"""

from .registry import FAMILIES, ScheduleArgError, family, generate, names, whole_names

__all__ = ["FAMILIES", "ScheduleArgError", "family", "generate", "names", "whole_names"]
