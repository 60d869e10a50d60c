"""What keeps a long run safe, attached to one rank's trainer in one call.

- the flight recorder (flight.py), fed by the executor (ops) and the messages
  (posts, waits, sends), and the test-only fault injector riding on it (faults.py);
- the non-finite loss guard (nonfinite.py);
- checkpoints (checkpoint.py): the resume before the first step, a save after
  each step that is due.

The trainer keeps its own job (stages, executor, collectives, optimizer) and
asks this object three things: which step to start at, whether to apply a
step's update, and to save after a step.
"""

from __future__ import annotations

from . import flight
from .checkpoint import Checkpoints
from .faults import injector_for
from .nonfinite import Guard


class Resilience:
    """One rank's recorder, guard and checkpoints. Mutable: through the objects it holds."""

    def __init__(self, trainer):
        env, cfg, ctx = trainer.env, trainer.cfg, trainer.executor.ctx
        injector = injector_for(cfg.fault, env.rank)
        self.flight = flight.Recorder(path=env.flight_path,
                                      on_start=injector.at if injector else None)
        ctx.flight = ctx.p2p.flight = self.flight
        if injector is not None and injector.fault.how == "nan":
            ctx.loss = injector.loss(ctx.loss)
        self.guard = Guard(env.rank, env.world, cfg.skip_nonfinite)
        topo = trainer.topo
        self.checkpoints = Checkpoints(cfg=cfg, schedule=trainer.schedule, stage_map=trainer.stage_map,
                                       stages=trainer.stages, optimizer=trainer.optimizer, rank=env.rank,
                                       world=env.world, pipe_rank=topo.pipe, replica=topo.replica,
                                       replicas=topo.dp, device=env.device, recorder=self.flight)
        self.first_step = self.checkpoints.restore() if cfg.resume else 0

    def update(self, k: int, loss: float, mb_losses: dict) -> bool:
        """Apply step ``k``'s update? (raises on a non-finite loss unless --skip-nonfinite)."""
        return self.guard.check(k, loss, mb_losses)

    def after_step(self, k: int) -> None:
        """Save a checkpoint after step ``k`` (0-based) when one is due."""
        if self.checkpoints.due(k + 1):
            self.checkpoints.save(k + 1)

    def checkpoint_info(self) -> dict | None:
        """What --save / --resume did, or None when no checkpoint was involved."""
        return dict(self.checkpoints.info) if self.checkpoints.info else None

    def skipped_steps(self) -> tuple[dict, ...] | None:
        """The steps whose update was skipped, or None without --skip-nonfinite."""
        return tuple(self.guard.skipped) if self.guard.skip else None
