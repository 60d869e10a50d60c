"""One rank's run: build its stages, execute the program each step, step the optimizer.

``preflight`` is the part of the setup that needs no process group: every rank
runs it (so a bad option fails on every rank alike) and the local launcher runs
it once before spawning anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ..schedule import Schedule
from ..schedules import generate
from .comm import P2P, message_plan
from .config import RunConfig, RunError
from .executor import Executor, RankContext
from .replicas import Replicas, all_sum
from .stage import build_stages, layout, partition
from .timing import CudaClock, WallClock, bubbles, measured_timeline


@dataclass(frozen=True, kw_only=True)
class Env:
    """Where a rank runs."""

    rank: int
    world: int
    device: torch.device
    backend: str
    launched_by: str | None = None  #: what set the world size, for messages ("WORLD_SIZE=4" under torchrun)


def preflight(cfg: RunConfig, world: int | None = None, launched_by: str | None = None) -> Schedule:
    """The schedule of ``cfg``, checked against the options, the model and the ranks launched.

    ``launched_by`` names what set the number of ranks (default ``-p N``; ``WORLD_SIZE`` under torchrun).
    """
    cfg.check()
    if cfg.csv:
        from .. import torch_csv

        sched = torch_csv.load(cfg.csv)
    else:
        sched = generate(cfg.schedule, cfg.ranks, cfg.microbatches, cfg.chunks)
    world = cfg.ranks if world is None else world
    if sched.ranks != world:
        src = f"--csv {cfg.csv}" if cfg.csv else f"{sched.name}"
        top = max(range(sched.stages), key=lambda s: sched.placement[s])
        raise RunError(f"{src}: the schedule's placement needs {sched.ranks} ranks (stage {top} is on rank "
                       f"{sched.placement[top]}); {world} were launched ({launched_by or f'-p {world}'})")
    if cfg.batch % sched.microbatches:
        raise RunError(f"--batch {cfg.batch} does not split into {sched.microbatches} equal micro-batches; use a "
                       f"--batch that is a multiple of {sched.microbatches}")
    lane = sched.lanes[0]
    partition(cfg.model.num_layers, lane.stage_hi - lane.stage_lo, cfg.split)
    optimizer_class(cfg.optimizer)
    return sched


def optimizer_class(name: str) -> type:
    """A torch.optim optimizer class by name, case-insensitive (``adamw``, ``sgd``, ``Adam``...)."""
    table = {n.lower(): c for n, c in vars(torch.optim).items()
             if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    cls = table.get(name.lower())
    if cls is None:
        raise RunError(f"--optimizer {name}: not a torch.optim optimizer; choose e.g. adamw, sgd, adam")
    return cls


def optimizer(cfg: RunConfig, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    return optimizer_class(cfg.optimizer)(params, lr=cfg.lr)


class RankTrainer:
    """One rank's training of one config, a step at a time. Mutable: weights, optimizer, results so far.

    Later features (data parallelism, recomputation, checkpoints) extend this object, not the executor.
    """

    def __init__(self, env: Env, cfg: RunConfig):
        self.env, self.cfg = env, cfg
        self.schedule = sched = preflight(cfg, env.world, env.launched_by)
        layers = cfg.model.layers()
        self.layout = layout(sched, layers, cfg.split)
        self.stages = build_stages(sched, self.layout, layers, env.rank, env.device)
        plan = message_plan(sched)
        p2p = P2P(plan, env.rank, env.device, cfg.timeout, tags=env.backend == "gloo")
        self.clock = CudaClock(env.device) if env.device.type == "cuda" else WallClock()
        ctx = RankContext(rank=env.rank, schedule=sched, plan=plan, stages=self.stages, p2p=p2p,
                          loss=cfg.model.loss, clock=self.clock)
        self.executor = Executor(ctx)
        self.replicas = Replicas(self.layout, self.stages, sched.placement, env.rank, env.device)
        self.params = [p for st in self.stages.values() for p in st.parameters()]
        self.optimizer = optimizer(cfg, self.params)
        self.out = {"losses": [], "step_time_s": [], "timelines": [], "grads": None}

    def step(self, k: int) -> tuple[float, float]:
        """Step ``k``: the program, replica and loss collectives, clipping, the optimizer. (loss, seconds)."""
        env, cfg, clock, out = self.env, self.cfg, self.clock, self.out
        m = self.schedule.microbatches
        inputs, targets = (t.to(env.device) for t in cfg.model.batch(k, cfg.batch))
        dist.barrier()
        clock.start()
        t0 = clock.mark()
        done = self.executor.step(list(inputs.chunk(m)), list(targets.chunk(m)))
        self.replicas.sync_grads()
        loss = all_sum(done.loss, env.device)
        if cfg.clip is not None:
            self.replicas.clip(self.params, cfg.clip)
        if k == 0 and "grads" in cfg.collect:
            out["grads"] = self.copies(lambda p: p.grad)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t1 = clock.mark()
        marks = clock.seconds(done.marks + [(t0, t1)])
        gathered = [None] * env.world if env.rank == 0 else None
        dist.gather_object(marks[:-1], gathered, dst=0)
        out["losses"].append(loss)
        out["step_time_s"].append(marks[-1][1] - marks[-1][0])
        if env.rank == 0:
            out["timelines"].append(measured_timeline(self.schedule, gathered))
        return loss, out["step_time_s"][-1]

    def result(self) -> dict:
        """Losses, step times; on rank 0 also the timelines and measured vs predicted bubble."""
        out = dict(self.out)
        if "params" in self.cfg.collect:
            out["params"] = self.copies(lambda p: p)
        if self.env.rank == 0 and out["timelines"]:
            timed = out["timelines"][1:] or out["timelines"]  # the first step warms up
            out["measured_bubble_fraction"], out["predicted_bubble_fraction"] = bubbles(timed)
        out["schedule"] = self.schedule.name
        out["ranks"], out["microbatches"] = self.schedule.ranks, self.schedule.microbatches
        return out

    def copies(self, get) -> dict:
        """logical name -> this rank's copies (as numpy), for tests that compare with the reference."""
        out: dict[str, list] = {}
        for name, holders in self.layout.params.items():
            for h in holders:
                if h.stage in self.stages:
                    t = get(self.stages[h.stage].param(h))
                    out.setdefault(name, []).append(None if t is None else t.detach().cpu().numpy().copy())
        return out


def run_job(env: Env, cfg: RunConfig, report: Callable | None = None) -> dict:
    """Train ``cfg`` on this rank; rank 0's result holds the losses, step times and timelines."""
    trainer = RankTrainer(env, cfg)
    for k in range(cfg.steps):
        loss, seconds = trainer.step(k)
        if report and env.rank == 0:
            report(k, loss, seconds)
    return trainer.result()
