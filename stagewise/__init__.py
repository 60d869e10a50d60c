"""stagewise: pipeline-parallel schedules you can generate, simulate, draw, plan and run.

The core is this package's own modules (actions, schedule, validate, engine, simulate, timeline, costs,
explain, limits, split, parallelism, ...): the schedule IR and everything that needs no torch. The
runtime's public API (``Pipeline``, ``Layers``, ``StepResult``, ``launch``, the MoE block ``MoE`` and its
helpers ``moe``, ``kv`` (what a causal model calls to run in sequence slices), ``StopNotice`` and
``Preempted``: a save on SIGTERM; docs/api.md) is re-exported here and loads torch only when first used.

May import: `stagewise.schedules`, `stagewise.lowering` (``simulate`` plays lowered programs), `stagewise.render`
(the notebook's pictures), `stagewise.cli` (``python -m stagewise``); never torch, matplotlib, the runtime or the planner.
"""

from . import display
from .actions import Action, Pair, parse
from .costs import Costs
from .errors import StagewiseError
from .parallelism import Parallelism, ParallelismError
from .schedule import Lane, Schedule
from .schedules import generate, names
from .simulate import simulate
from .timeline import Metrics, Timeline, metrics
from .validate import ScheduleError, validate

__all__ = [
    "Action", "Pair", "parse", "Costs", "Lane", "Schedule", "generate", "names",
    "simulate", "Timeline", "Metrics", "metrics", "ScheduleError", "StagewiseError", "validate", "Split",
    "Parallelism", "ParallelismError",
    "Pipeline", "Layers", "StepResult", "launch", "MoE", "moe", "kv", "StopNotice", "Preempted", "render",
]

#: the runtime's public API, imported with torch on first use, and ``Split`` (the layout's parser, which no
#: `stagewise simulate` needs): name -> module
_LAZY = {"Pipeline": ".runtime.pipeline", "StepResult": ".runtime.pipeline", "Layers": ".runtime.stages.layers",
         "launch": ".runtime.launching.local", "MoE": ".runtime.stages.moe", "Split": ".split",
         "StopNotice": ".runtime.resilience.preempt", "Preempted": ".runtime.resilience.preempt"}
#: public modules imported on first use: ``stagewise.moe`` (pack, unpack, with_aux; with torch), ``stagewise.kv``
#: (extend, offset, causal_mask: a causal model's attention in sequence slices; with torch) and
#: ``stagewise.render`` (write_timeline, draw_text: pictures of a timeline, no torch)
_LAZY_MODULES = {"moe": ".runtime.stages.moe", "kv": ".runtime.stages.kv", "render": ".render"}


def _notebook() -> None:  # Jupyter display: the notebook module registers its drawers (stagewise.display)
    from . import notebook  # noqa: F401


display.loads_with(_notebook)


def __getattr__(name: str):
    if name in _LAZY or name in _LAZY_MODULES:
        import importlib

        if name in _LAZY_MODULES:
            return importlib.import_module(_LAZY_MODULES[name], __name__)
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'stagewise' has no attribute {name!r}")
__version__ = "0.1.0"
