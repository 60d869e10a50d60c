"""One rank's run: build its stages, execute the program each step, step the optimizer.

``preflight`` is the part of the setup that needs no process group: every rank
runs it (so a bad option fails on every rank alike) and the local launcher runs
it once before spawning anything.
"""

from __future__ import annotations

import dataclasses

import inspect
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ...schedule import Schedule
from ..resilience import checkpoint_files
from ..execution.activation_memory import merge_added, predicted_peaks
from ..config import RunConfig, RunError, check_batch
from ..resolve import resolve_schedule
from ..resilience.faults import check_fault, injector_for, parse_fault
from ..pipeline import Pipeline, gather_full
from ..execution.recompute import check_recompute, recompute_stages
from ..resilience import flight
from ..resilience.checkpoint import Checkpoints
from ..resilience.preempt import Preempted, StopNotice
from ..parallel.state_memory import held_bytes, predicted_bytes
from ..result import Memory, RunResult
from ..stages.stage import partition
from ..execution.timing import bubbles
from ...data.tensors import tokens


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

    ``launched_by`` names what set the number of ranks (default `ranks` x `dp` x `fsdp` x `tp`; ``WORLD_SIZE``
    under torchrun).
    """
    cfg.check()
    world = cfg.world if world is None else world
    named = isinstance(cfg.schedule, str) and not cfg.csv
    sched = resolve_schedule(cfg.schedule, world=world, dp=cfg.parallelism.per_pipeline_rank, csv=cfg.csv,
                             launched_by=launched_by, microbatches=cfg.microbatches if named else None,
                             chunks=cfg.chunks if named else None, ranks=cfg.ranks if named else None,
                             across=across(cfg), slices=cfg.slices if named else None)
    check_batch(cfg.batch, sched.microbatches // sched.slices, cfg.dp, cfg.fsdp, cfg.ep)  # a --csv schedule brings its own m
    recompute_stages(cfg.recompute, sched.stages)
    sched = with_memory_actions(cfg, sched)
    fit = getattr(cfg.model, "check_fit", None)  # a model may say it in its own terms (HF: decoder layers)
    if fit is not None:
        fit(sched.stages_per_copy, cfg.layer_split())
    partition(cfg.model.num_layers, sched.stages_per_copy, cfg.layer_split())
    optimizer_class(cfg.optimizer)
    if cfg.fault:
        check_fault(parse_fault(cfg.fault), sched, world // sched.ranks)
    checkpoint_files.preflight(cfg, optimizer_class(cfg.optimizer).__name__, cfg.model.num_layers)
    return sched


def with_memory_actions(cfg: RunConfig, sched: Schedule) -> Schedule:
    """``sched`` with the OFFLOAD and RELOAD of `offload`'s stages and, at the bubble, the RECOMPUTE of
    `recompute`'s placed (stagewise.memory_actions); recomputation at the backward stays the pipeline's own."""
    from ...memory_actions import MemoryActionError, place, policy_of

    check_recompute(cfg.offload, "offload")
    off = recompute_stages(cfg.offload, sched.stages, "offload")
    rec = recompute_stages(cfg.recompute, sched.stages) if cfg.recompute_at == "bubble" else frozenset()
    if not off and not rec:
        return sched
    both = sorted(off & recompute_stages(cfg.recompute, sched.stages))
    if both:
        raise RunError(f"`offload` and `recompute` both name stage {both[0]}; a stage's activations are offloaded "
                       "or recomputed, not both")
    try:
        return place(sched, policy_of(sched.stages, sorted(off), sorted(rec)), recompute_at=cfg.recompute_at)
    except MemoryActionError as e:
        raise RunError(str(e)) from None


def pipeline_recompute(cfg: RunConfig):
    """What the pipeline itself recomputes: `recompute` at the backward (at the bubble the program's RECOMPUTE
    actions do it)."""
    return False if cfg.recompute_at == "bubble" else cfg.recompute


def across(cfg: RunConfig) -> str:
    """The grid's other dimensions as the options say them: "`dp` 2 x `fsdp` 2" (None: none but pp)."""
    parts = [f"`{d}` {n}" for d, n in cfg.parallelism.degrees().items() if d != "pp" and n > 1]
    return " x ".join(parts) or None


def optimizer_class(name: str) -> type:
    """A torch.optim optimizer class by name, case-insensitive (``adamw``, ``sgd``, ``Adam``...).

    Checked before any rank starts: it must step without a closure (LBFGS re-evaluates the loss, which a
    pipeline step cannot). Whether it can step this model's parameters is ``optimizer``'s trial step.
    """
    table = {n.lower(): c for n, c in vars(torch.optim).items()
             if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    cls = table.get(name.lower())
    if cls is None:
        raise RunError(f"`optimizer` {name}: not a torch.optim optimizer; choose e.g. adamw, sgd, adam")
    closure = inspect.signature(cls.step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise RunError(f"`optimizer` {name}: {cls.__name__} needs a closure (it re-evaluates the loss), which a "
                       "pipeline step cannot give; choose e.g. adamw, sgd, adam")
    return cls


def optimizer(cfg: RunConfig, params: list[torch.Tensor], zero_group=None) -> torch.optim.Optimizer:
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
        raise RunError(f"`optimizer` {cfg.optimizer}: {cls.__name__} cannot step this model's dense weights and "
                       f"biases ({e})") from None
    if cfg.zero:  # ZeRO-1: each dp replica steps (and keeps the state of) its share, then broadcasts it
        from ..parallel.dp import zero_optimizer

        return zero_optimizer(params, cls, zero_group, lr=cfg.lr)
    return cls(params, lr=cfg.lr)


class RankTrainer:
    """One rank's training of one config, a step at a time: a client of ``Pipeline`` (the per-rank API) that
    adds the config-driven loop: data from the model config, clipping, the optimizer, checkpoints and results.
    What the pipeline runs with (the flight recorder, the loss, the non-finite policy) is given to it when it is
    built, never patched on later.

    Mutable: weights, optimizer, results so far.
    """

    def __init__(self, env: Env, cfg: RunConfig):
        self.env, self.cfg = env, cfg
        self.schedule = sched = preflight(cfg, env.world, env.launched_by)
        injector = injector_for(cfg.fault, env.rank)  # tests only: a failure on purpose, at an op's start
        self.flight = flight.Recorder(path=env.flight_path, on_start=injector.at if injector else None)
        self.shifts = sched.slices > 1 and hasattr(cfg.model, "shift_labels")  # HF: labels shifted before slicing
        own = cfg.model.shifted_loss if self.shifts else cfg.model.loss
        loss = injector.loss(own) if injector is not None and injector.fault.how == "nan" else own
        layout = dataclasses.replace(cfg.parallelism, pp=sched.ranks)  # a --csv schedule brings its own ranks
        self.pipe = pipe = Pipeline(sched, cfg.model.layers(), loss, split=cfg.layer_split(), parallelism=layout,
                                    overlap=None if cfg.overlap else False, device=env.device,
                                    recompute=pipeline_recompute(cfg), static_shapes=True, timeout=cfg.timeout,
                                    measure_memory=cfg.measure_memory, flight=self.flight,
                                    nonfinite="skip" if cfg.skip_nonfinite else "raise",
                                    seed=getattr(cfg.model, "seed", None))
        self.device_peak = 0  # torch.cuda.max_memory_allocated over the steps (GPU only)
        self.optimizer = optimizer(cfg, pipe.parameters(), pipe.group("dp") if cfg.zero else None)
        self.state_bytes: dict | None = None  # parameter, gradient and optimizer bytes here (after step 1)
        self.losses: list[float] = []
        self.tokens: list[tuple[int, int]] = []  # per step, (real tokens, token places) of the whole batch
        self.step_time_s: list[float] = []
        self.timelines: list = []  # rank 0's
        self.skipped: list[dict] = []  # the steps whose update a non-finite loss skipped
        self.grads = None  # collect="grads": after step 1
        self.checkpoints = Checkpoints(cfg=cfg, pipe=pipe, optimizer=self.optimizer, rank=env.rank, world=env.world,
                                       device=env.device, recorder=self.flight,
                                       export=getattr(cfg.model, "export", None))
        self.first_step = self.checkpoints.restore() if cfg.resume else 0  # a resume continues after its step
        pipe.steps_done = self.first_step  # dropout's masks continue too

    def step(self, k: int) -> tuple[float, float]:
        """Step ``k``: the pipeline's step (program, replica and loss collectives), clipping, the optimizer.
        (loss, seconds)."""
        env, cfg = self.env, self.cfg
        inputs, targets = cfg.step_batch(k)
        if self.shifts:
            targets = cfg.model.shift_labels(targets)
        self.tokens.append(tokens(targets))
        self.flight.step(k)
        if env.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(env.device)
        res = self.pipe.step(inputs, targets, timeline=True)  # starts with a barrier: op times line up
        t0 = time.perf_counter()
        if env.device.type == "cuda":
            self.device_peak = max(self.device_peak, torch.cuda.max_memory_allocated(env.device))
        if res.skipped is not None:  # every rank alike: the loss was all-reduced
            self.skipped.append({"step": k + 1, "loss": res.loss, "where": res.skipped})
        elif cfg.clip is not None:
            self.pipe.clip_grad_norm_(cfg.clip)
        if k == 0 and "grads" in cfg.collect:
            self.grads = self.copies(lambda p: p.grad)
        if res.skipped is None:
            self.optimizer.step()
        if self.state_bytes is None:  # gradients and the optimizer's state all exist now
            self.state_bytes = held_bytes(self.pipe.parameters(), self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        if env.device.type == "cuda":
            torch.cuda.synchronize(env.device)
        self.losses.append(res.loss)
        self.step_time_s.append(res.seconds + time.perf_counter() - t0)
        if env.rank == 0:
            self.timelines.append(res.timeline)
        return res.loss, self.step_time_s[-1]

    def after_step(self, k: int) -> None:
        """Save a checkpoint after step ``k`` (0-based) when one is due."""
        if self.checkpoints.due(k + 1):
            self.checkpoints.save(k + 1)

    def save_now(self, done: int) -> str:
        """The checkpoint after ``done`` steps (written now unless ``after_step`` just did): its folder."""
        saved = self.checkpoints.info.get("saved", [])
        folder = str(checkpoint_files.step_dir(self.cfg.save, done))
        if not saved or saved[-1] != folder:
            self.checkpoints.save(done)
        return folder

    def result(self) -> RunResult:
        """Losses, step times; on rank 0 also the timelines, measured vs predicted bubble and memory."""
        measured = predicted = None
        if self.env.rank == 0 and self.timelines:
            timed = self.timelines[1:] or self.timelines  # the first step warms up
            measured, predicted = bubbles(timed)
        memory = self._memory()  # a collective: every rank calls it
        built = self._gather(self.pipe.built_layers)
        return RunResult(schedule=self.schedule.name, ranks=self.schedule.ranks,
                         microbatches=self.schedule.microbatches // self.schedule.slices,
                         slices=self.schedule.slices, losses=tuple(self.losses),
                         tokens=tuple(t for t, _ in self.tokens), token_places=tuple(n for _, n in self.tokens),
                         first_step=self.first_step,
                         step_time_s=tuple(self.step_time_s), timelines=tuple(self.timelines),
                         measured_bubble_fraction=measured, predicted_bubble_fraction=predicted,
                         parallelism=self.pipe.parallelism,
                         recompute=tuple(sorted(recompute_stages(self.cfg.recompute, self.schedule.stages))),
                         memory=memory,
                         checkpoint=dict(self.checkpoints.info) if self.checkpoints.info else None,
                         skipped_steps=tuple(self.skipped) if self.cfg.skip_nonfinite else None,
                         layers_built=tuple(built) if built else None,
                         read_bytes=self._gather(self.cfg.model.read_bytes()) if hasattr(self.cfg.model, "read_bytes")
                         else None, grads=self.grads,
                         params=self.copies(lambda p: p) if "params" in self.cfg.collect else None)

    def _gather(self, value) -> list | None:
        """Every rank's ``value`` on rank 0 (a collective; None elsewhere)."""
        gathered = [None] * self.env.world if self.env.rank == 0 else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def _memory(self) -> Memory | None:
        """Per rank: the model state held against the parallelism's share and, when counted, peak activation
        bytes against the simulator's prediction (on rank 0; a collective)."""
        meter = self.pipe.meter
        zero = self.cfg.dp if self.cfg.zero else 1
        mine = {"state": self.state_bytes, "predicted": predicted_bytes(self.pipe.parameters(), self.cfg.optimizer,
                                                                           zero), "device": self.device_peak or None}
        gathered = self._gather({**mine, **(meter.report() if meter is not None else {})})
        if self.env.rank != 0:
            return None
        state = dict(state_bytes=tuple(r["state"] for r in gathered) if gathered[0]["state"] else None,
                     predicted_state_bytes=tuple(r["predicted"] for r in gathered))
        if meter is None:  # --no-memory: no activation counts
            return Memory(**state)
        # the grid's ranks in global order; the pipeline of the first replica is ranks 0..p-1 only without
        # fsdp or tp (the default grid puts tp innermost), so take that pipeline's ranks by place
        pipe0 = [gathered[r] for r in self.pipe.topo.groups("pp")[0]]
        added = merge_added(pipe0)
        predicted = predicted_peaks(self.schedule, added, self.pipe.recompute)
        by_rank = {r: predicted[self.pipe.topo.coords_of(r)["pp"]] for r in range(self.env.world)}
        return Memory(stage_activation_bytes=added, peak_activation_bytes=tuple(r["peak"] for r in gathered),
                      predicted_peak_activation_bytes=tuple(by_rank[r] for r in range(self.env.world)),
                      peak_memory_allocated_bytes=tuple(r["device"] for r in gathered) if gathered[0]["device"]
                      else None, **state)

    def copies(self, get) -> dict:
        """logical name -> this rank's copies (as numpy, sharded ones whole: a collective), for tests that compare
        with the reference."""
        out: dict[str, list] = {}
        stages = self.pipe.stages
        for name, holders in self.pipe.stage_map.params.items():
            for h in holders:
                if h.stage in stages:
                    t = get(stages[h.stage].param(h))
                    t = gather_full({"t": t})["t"] if t is not None else None
                    out.setdefault(name, []).append(None if t is None else t.detach().cpu().numpy().copy())
        return out


def run_job(env: Env, cfg: RunConfig, report: Callable | None = None) -> RunResult:
    """Train ``cfg`` on this rank; rank 0's result holds the losses, step times and timelines. With
    ``save_on_signal``, a stop notice to any rank saves after the step in flight and raises ``Preempted``."""
    notice = StopNotice(cfg.save_on_signal, env.device) if cfg.save_on_signal is not None else None
    try:
        trainer = RankTrainer(env, cfg)
        for k in range(trainer.first_step, cfg.steps):
            loss, seconds = trainer.step(k)
            if report and env.rank == 0:
                report(k, loss, seconds)
            trainer.after_step(k)
            if notice is not None and k + 1 < cfg.steps and notice.agreed():
                raise Preempted(k + 1, trainer.save_now(k + 1))
            if _grows(cfg, trainer, k + 1):
                break  # every rank alike: slots came back and this step's checkpoint is written
        return trainer.result()
    finally:
        if notice is not None:
            notice.close()


def _grows(cfg: RunConfig, trainer: RankTrainer, done: int) -> bool:
    """Whether the ranks stop after ``done`` steps to grow back (``grow_after``): the first checkpoint written
    once the slots have come back, with steps left to run at the larger layout."""
    return (cfg.grow_after is not None and done >= cfg.grow_after and done < cfg.steps
            and trainer.checkpoints.due(done))
