"""Scheduling by search instead of by family: an order of F, I, W per rank under a memory cap (``auto_schedule``,
the Zero Bubble paper's list scheduler and its variants), per stage keep / offload / recompute under a cap
(``memory_policy``), the proven optimum for small cases (``optimum``, HiGHS),
and the top configurations of a profile search re-run with an automatic order (``refine``).

May import: the core, `stagewise.schedules`, `stagewise.plan.errors`, `stagewise.plan.highs`,
`stagewise.plan.search`.

Example:
    >>> from stagewise.plan.auto import auto_schedule
"""

from .auto import CapError, auto_schedule, objective_of
from .greedy import Policy, greedy
from .memory_search import PolicyResult, memory_policy
from .milp import optimum
from .refine import refine

__all__ = ["CapError", "Policy", "PolicyResult", "auto_schedule", "greedy", "memory_policy", "objective_of", "optimum",
           "refine"]
