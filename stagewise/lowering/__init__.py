"""Lowering: communication as actions. ``lower(schedule, parallelism, options)`` turns a schedule's compute
programs into per-rank programs of compute and communication actions (SEND/RECV per boundary and direction,
UNSHARD/RESHARD and REDUCE_GRAD per stage, the expert all-to-all, the tie all-reduce, the step-end
collectives), each with its peer or group, bytes and stream. It is the one place these rules live; ``play``
simulates a lowered schedule with communication on its own resources, ``check`` validates one (matching
sends and receives, the order of collectives, gathered before use), ``torch_comms`` reads and writes torch's
compute+comms CSV. No torch here.

May import: the core.
"""

from ..comm_actions import CommAction
from .communication import Communication
from .lower import Lowered, lower
from .options import FRAMEWORKS, LoweringOptions, Network, Overlap, Sizes

__all__ = ["CommAction", "Lowered", "lower", "Communication", "FRAMEWORKS", "LoweringOptions", "Network", "Overlap", "Sizes"]
