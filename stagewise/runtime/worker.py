"""One rank's run: build its stages, execute the program each step, step the optimizer.

``preflight`` is the part of the setup that needs no process group: every rank
runs it (so a bad option fails on every rank alike) and the local launcher runs
it once before spawning anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ..schedule import Schedule
from ..schedules import generate
from . import checkpoint_files
from .activation_memory import merge_added, predicted_peaks
from .config import RunConfig, RunError
from .dp import Topology
from .faults import check_fault, parse_fault
from .pipeline import Pipeline
from .recompute import recompute_stages
from .resilience import Resilience
from .stage import partition
from .timing import bubbles


@dataclass(frozen=True, kw_only=True)
class Env:
    """Where a rank runs."""

    rank: int
    world: int
    device: torch.device
    backend: str
    launched_by: str | None = None  #: what set the world size, for messages ("WORLD_SIZE=4" under torchrun)
    flight_path: str | None = None  #: this rank's flight-recorder file (flight.py); None keeps it in memory


def preflight(cfg: RunConfig, world: int | None = None, launched_by: str | None = None) -> Schedule:
    """The schedule of ``cfg``, checked against the options, the model and the ranks launched.

    ``launched_by`` names what set the number of ranks (default ``-p N``; ``WORLD_SIZE`` under torchrun).
    """
    cfg.check()
    if cfg.csv:
        from .. import torch_csv

        sched = torch_csv.load(cfg.csv)
    elif isinstance(cfg.schedule, Schedule):  # a value (the planner's auto, a search result): no CSV between
        sched = cfg.schedule
    else:
        sched = generate(cfg.schedule, cfg.ranks, cfg.microbatches, cfg.chunks)
    world = cfg.ranks * cfg.dp if world is None else world
    launched_by = launched_by or f"-p {world // cfg.dp}" + (f" x --dp {cfg.dp}" if cfg.dp > 1 else "")
    if world % cfg.dp:
        raise RunError(f"--dp {cfg.dp} does not divide the {world} ranks launched ({launched_by}); launch p x dp "
                       "ranks")
    if sched.ranks != world // cfg.dp:
        src = f"--csv {cfg.csv}" if cfg.csv else f"{sched.name}"
        top = max(range(sched.stages), key=lambda s: sched.placement[s])
        per = f" per replica (--dp {cfg.dp})" if cfg.dp > 1 else ""
        raise RunError(f"{src}: the schedule's placement needs {sched.ranks} ranks (stage {top} is on rank "
                       f"{sched.placement[top]}); {world // cfg.dp} were launched{per} ({launched_by})")
    if cfg.batch % (sched.microbatches * cfg.dp):
        share = sched.microbatches * cfg.dp
        raise RunError(f"--batch {cfg.batch} does not split into {sched.microbatches} equal micro-batches"
                       f"{f' on each of --dp {cfg.dp} replicas' if cfg.dp > 1 else ''}; use a --batch that is a "
                       f"multiple of {share}")
    recompute_stages(cfg.recompute, sched.stages)
    partition(cfg.model.num_layers, sched.stages_per_copy, cfg.split)
    optimizer_class(cfg.optimizer)
    if cfg.fault:
        check_fault(parse_fault(cfg.fault), sched, cfg.dp)
    checkpoint_files.preflight(cfg, optimizer_class(cfg.optimizer).__name__, cfg.model.num_layers)
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
    """One rank's training of one config, a step at a time: a client of ``Pipeline`` (the per-rank API) that
    adds the CLI's loop: data from the model config, resilience, clipping, the optimizer and results.

    Mutable: weights, optimizer, results so far.
    """

    def __init__(self, env: Env, cfg: RunConfig):
        self.env, self.cfg = env, cfg
        self.schedule = sched = preflight(cfg, env.world, env.launched_by)
        self.topo = Topology(p=sched.ranks, dp=cfg.dp, rank=env.rank)
        self.pipe = pipe = Pipeline(sched, cfg.model.layers(), cfg.model.loss, split=cfg.split, dp=cfg.dp,
                                    device=env.device, recompute=cfg.recompute, static_shapes=True,
                                    timeout=cfg.timeout, measure_memory=cfg.measure_memory)
        self.layout, self.stages, self.replicas, self.dp = pipe.layout, pipe.stages, pipe.replicas, pipe.dp
        self.executor, self.clock, self.meter, self.recompute = pipe.executor, pipe.clock, pipe.meter, pipe.recompute
        self.device_peak = 0  # torch.cuda.max_memory_allocated over the steps (GPU only)
        self.params = pipe.parameters()
        self.optimizer = optimizer(cfg, self.params)
        self.out = {"losses": [], "step_time_s": [], "timelines": [], "grads": None}
        self.safety = Resilience(self)  # flight recorder, non-finite guard, checkpoints (resumes here)

    def step(self, k: int) -> tuple[float, float]:
        """Step ``k``: the pipeline's step (program, replica and loss collectives), clipping, the optimizer.
        (loss, seconds)."""
        env, cfg, out = self.env, self.cfg, self.out
        inputs, targets = cfg.model.batch(k, cfg.batch)
        self.safety.flight.step(k)
        if env.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(env.device)
        res = self.pipe.step(inputs, targets, timeline=True)  # starts with a barrier: op times line up
        t0 = time.perf_counter()
        if env.device.type == "cuda":
            self.device_peak = max(self.device_peak, torch.cuda.max_memory_allocated(env.device))
        update = self.safety.update(k, res.loss, self.pipe.last_outcome.mb_losses)  # every rank alike
        if cfg.clip is not None and update:
            self.pipe.clip_grad_norm_(cfg.clip)
        if k == 0 and "grads" in cfg.collect:
            out["grads"] = self.copies(lambda p: p.grad)
        if update:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        out["losses"].append(res.loss)
        out["step_time_s"].append(res.seconds + time.perf_counter() - t0)
        if env.rank == 0:
            out["timelines"].append(res.timeline)
        return res.loss, out["step_time_s"][-1]

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
        out.update(self._memory())
        out.update(self.safety.result())
        return out

    def _memory(self) -> dict:
        """Measured peak activation bytes per rank and the simulator's prediction (on rank 0; a collective)."""
        if self.meter is None:  # --no-memory: every rank skips the gather alike
            return {"dp": self.cfg.dp, "recompute": sorted(self.recompute)} if self.env.rank == 0 else {}
        mine = {**self.meter.report(), "device": self.device_peak or None}
        gathered = [None] * self.env.world if self.env.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if self.env.rank != 0:
            return {}
        added = merge_added(gathered[:self.topo.p])
        predicted = predicted_peaks(self.schedule, added, self.recompute)
        return {"dp": self.cfg.dp, "recompute": sorted(self.recompute), "stage_activation_bytes": added,
                "peak_activation_bytes": [r["peak"] for r in gathered],
                "predicted_peak_activation_bytes": predicted * self.cfg.dp,
                "peak_memory_allocated_bytes": [r["device"] for r in gathered] if gathered[0]["device"] else None}

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
    for k in range(trainer.safety.first_step, cfg.steps):  # a resumed run starts after its checkpoint's step
        loss, seconds = trainer.step(k)
        if report and env.rank == 0:
            report(k, loss, seconds)
        trainer.safety.after_step(k)
    return trainer.result()
