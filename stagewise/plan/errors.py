"""The planner's user-facing error: the CLI prints its message on one line and exits 2."""

from ..errors import StagewiseError


class PlanError(StagewiseError):
    """Bad planner input (profile, layout, memory limit, device count); the message says how to fix it."""
