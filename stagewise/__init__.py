"""stagewise: pipeline-parallel schedules you can generate, simulate, draw, plan and run.

The core (this package minus ``render`` and ``runtime``) imports neither torch
nor matplotlib.
"""

from .actions import Action, Pair, parse
from .costs import Costs
from .schedule import Lane, Schedule
from .schedules import generate, names
from .simulate import simulate
from .timeline import Metrics, Timeline, metrics
from .validate import ScheduleError, validate

__all__ = [
    "Action", "Pair", "parse", "Costs", "Lane", "Schedule", "generate", "names",
    "simulate", "Timeline", "Metrics", "metrics", "ScheduleError", "validate",
]
__version__ = "0.1.0"
