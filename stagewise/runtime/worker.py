"""One rank's run: build its stages, execute the program each step, step the optimizer.

``preflight`` is the part of the setup that needs no process group: every rank
runs it (so a bad option fails on every rank alike) and the local launcher runs
it once before spawning anything.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ..schedule import Schedule
from ..schedules import generate
from . import checkpoint_files
from .activation_memory import ActivationMeter, merge_added, predicted_peaks
from .comm import P2P, message_plan
from .config import RunConfig, RunError
from .dp import DataParallel, Topology
from .executor import Executor, RankContext
from .faults import check_fault, parse_fault
from .flight import SYNC
from .recompute import Recompute, recompute_stages
from .replicas import Replicas, all_sum
from .resilience import Resilience
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
    flight_path: str | None = None  #: this rank's flight-recorder file (flight.py); None keeps it in memory


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
    lane = sched.lanes[0]
    partition(cfg.model.num_layers, lane.stage_hi - lane.stage_lo, cfg.split)
    optimizer_class(cfg.optimizer)
    if cfg.fault:
        check_fault(parse_fault(cfg.fault), sched, cfg.dp)
    checkpoint_files.preflight(cfg, optimizer_class(cfg.optimizer).__name__, cfg.model.num_layers)
    return sched


def optimizer_class(name: str) -> type:
    """A torch.optim optimizer class by name, case-insensitive (``adamw``, ``sgd``, ``Adam``...).

    Checked before any rank starts: it must step without a closure (LBFGS re-evaluates the loss, which a
    pipeline step cannot). Whether it can step this model's parameters is ``optimizer``'s trial step.
    """
    table = {n.lower(): c for n, c in vars(torch.optim).items()
             if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    cls = table.get(name.lower())
    if cls is None:
        raise RunError(f"--optimizer {name}: not a torch.optim optimizer; choose e.g. adamw, sgd, adam")
    closure = inspect.signature(cls.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise RunError(f"--optimizer {name}: {cls.__name__} needs a closure (it re-evaluates the loss), which a "
                       "pipeline step cannot give; choose e.g. adamw, sgd, adam")
    return cls


def optimizer(cfg: RunConfig, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The optimizer of ``params``, after a trial step on a dense matrix and vector (SparseAdam, or Muon with
    its 2-D parameters only, fail here as --optimizer, not in the first step). Not in the launcher's
    preflight: the first optimizer constructed in a process imports torch._dynamo (seconds); ranks have it."""
    cls = optimizer_class(cfg.optimizer)
    trial = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))]
    for p in trial:
        p.grad = torch.ones_like(p)
    try:
        cls(trial, lr=cfg.lr).step()
    except Exception as e:  # noqa: BLE001 - whatever it is, the optimizer cannot train this model
        raise RunError(f"--optimizer {cfg.optimizer}: {cls.__name__} cannot step this model's dense weights and "
                       f"biases ({e})") from None
    return cls(params, lr=cfg.lr)


class RankTrainer:
    """One rank's training of one config, a step at a time. Mutable: weights, optimizer, results so far.

    Later features extend this object: data parallelism (``dp``), recomputation and the activation meter
    reach the executor through its context only.
    """

    def __init__(self, env: Env, cfg: RunConfig):
        self.env, self.cfg = env, cfg
        self.schedule = sched = preflight(cfg, env.world, env.launched_by)
        self.topo = topo = Topology(p=sched.ranks, dp=cfg.dp, rank=env.rank)
        layers = cfg.model.layers()
        self.layout = layout(sched, layers, cfg.split)
        self.stages = build_stages(sched, self.layout, layers, topo.pipe, env.device)
        plan = message_plan(sched)
        p2p = P2P(plan, topo.pipe, env.device, cfg.timeout, tags=env.backend == "gloo", base=topo.base)
        self.clock = CudaClock(env.device) if env.device.type == "cuda" else WallClock()
        self.recompute = recompute_stages(cfg.recompute, sched.stages)
        self.meter = ActivationMeter(self.stages) if cfg.measure_memory else None
        self.replicas = Replicas(self.layout, self.stages, sched.placement, topo.pipe, env.device, topo)
        self.dp = DataParallel(topo, sched, self.stages, cfg.timeout) if cfg.dp > 1 else None
        ctx = RankContext(rank=topo.pipe, schedule=sched, plan=plan, stages=self.stages, p2p=p2p,
                          loss=self._loss, clock=self.clock, recompute=Recompute(self.recompute, env.device),
                          meter=self.meter, after=self.dp.after if self.dp else None)
        self.executor = Executor(ctx)
        self.device_peak = 0  # torch.cuda.max_memory_allocated over the steps (GPU only)
        self.params = [p for st in self.stages.values() for p in st.parameters()]
        self.optimizer = optimizer(cfg, self.params)
        self.out = {"losses": [], "step_time_s": [], "timelines": [], "grads": None}
        self.safety = Resilience(self)  # flight recorder, non-finite guard, checkpoints (resumes here)

    def step(self, k: int) -> tuple[float, float]:
        """Step ``k``: the program, replica and loss collectives, clipping, the optimizer. (loss, seconds)."""
        env, cfg, clock, out = self.env, self.cfg, self.clock, self.out
        m = self.schedule.microbatches
        inputs, targets = (self.topo.share(t.to(env.device)) for t in cfg.model.batch(k, cfg.batch))
        self.safety.flight.step(k)
        dist.barrier()
        if env.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(env.device)
        clock.start()
        t0 = clock.mark()
        # a storage per micro-batch, so the meter counts each micro-batch's tokens apart
        done = self.executor.step([c.clone() for c in inputs.chunk(m)], [c.clone() for c in targets.chunk(m)])
        if env.device.type == "cuda":
            self.device_peak = max(self.device_peak, torch.cuda.max_memory_allocated(env.device))
        self.safety.flight.event(SYNC, "gradients and loss")
        if self.dp is not None:
            self.dp.finish()
        self.replicas.sync_grads()
        loss = all_sum(done.loss, env.device)
        update = self.safety.update(k, loss, done.mb_losses)  # every rank alike: the loss is all-reduced
        if cfg.clip is not None and update:
            self.replicas.clip(self.params, cfg.clip)
        if k == 0 and "grads" in cfg.collect:
            out["grads"] = self.copies(lambda p: p.grad)
        if update:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t1 = clock.mark()
        marks = clock.seconds(done.marks + [(t0, t1)])
        gathered = [None] * env.world if env.rank == 0 else None
        dist.gather_object(marks[:-1], gathered, dst=0)
        out["losses"].append(loss)
        out["step_time_s"].append(marks[-1][1] - marks[-1][0])
        if env.rank == 0:
            out["timelines"].append(measured_timeline(self.schedule, gathered[:self.topo.p]))  # replica 0
        return loss, out["step_time_s"][-1]

    def _loss(self, output, target):
        """The model's loss, divided by dp: summed over every replica it is the whole batch's mean."""
        loss = self.cfg.model.loss(output, target)
        return loss / self.cfg.dp if self.cfg.dp > 1 else loss

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
