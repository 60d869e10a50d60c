"""What ``Costs.comm`` holds: a schedule's communication as the lowering makes it, which the core's ``simulate``
plays through ``Communication.simulate`` without importing the lowering. Above ``lower`` and ``play``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..costs import per_stage
from ..parallelism import Parallelism
from .lower import lower
from .options import LoweringOptions


@dataclass(frozen=True, kw_only=True)
class Communication:
    """What ``Costs.comm`` holds: the layout around the pipeline (its ``pp`` is the schedule's ranks, whatever
    it says here) and the lowering's options; ``simulate`` lowers the schedule with them and plays that."""

    parallelism: Parallelism = field(default_factory=Parallelism)
    options: LoweringOptions = field(default_factory=LoweringOptions)
    given: "object | None" = None  #: programs already lowered (a compute+comms CSV): played as they are

    def scaled(self, weights: list[float]) -> "Communication":
        """The same with each stage's weights, gradients and dispatch bytes times its weight (``costs.scaled``:
        sizes given for one rank's share of the model, so a chunk of a v-chunk schedule holds 1/v of them)."""
        from dataclasses import replace

        z = self.options.sizes
        n = len(weights)
        sizes = replace(z, params=[x * w for x, w in zip(per_stage("param_bytes", z.params, n), weights)],
                        grads=None if z.grads is None else
                        [x * w for x, w in zip(per_stage("grad_bytes", z.grads, n), weights)],
                        a2a=[x * w for x, w in zip(per_stage("a2a_bytes", z.a2a, n), weights)])
        return replace(self, options=replace(self.options, sizes=sizes))

    def lower(self, schedule):
        from dataclasses import replace

        if self.given is not None and self.given.schedule.programs == schedule.programs:
            return self.given
        par = replace(self.parallelism, pp=schedule.ranks)
        par.check()
        return lower(schedule, par, self.options)

    def simulate(self, schedule, costs, *, check: bool = True):
        """``schedule`` lowered (``lower``) and played with its transfers: ``simulate``'s path when ``costs.comm``
        is set, here so the core's ``simulate`` names no lowering."""
        from .play import simulate_lowered

        return simulate_lowered(self.lower(schedule), costs, check=check)
