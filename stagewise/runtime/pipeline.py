"""The per-rank pipeline a user's own training loop drives: ``Pipeline(schedule, model, loss_fn)``.

Each rank builds only the layers of its own stages (layers.py), then runs its
program of the schedule once per ``step`` with the executor, the message plan,
split backward, recomputation, tied-parameter sums and the data-parallel
reduction of the runtime. The optimizer, LR schedule, data and loop are the
user's; every rank constructs its ``Pipeline`` and calls ``step`` alike (both
are collective). Parameters keep the original model's names end to end.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..schedule import Schedule
from ..timeline import Timeline
from .stages import kv, microbatches, pytree, rng
from .execution.activation_memory import ActivationMeter
from .messages.p2p import P2P
from .execution.program import lower
from .arguments import check_autocast, check_device, check_seed
from .config import RunError, check_positive_number, check_timeout
from .resolve import resolve_schedule
from .parallel.dp import DataParallel
from .parallel.fsdp import Sharded
from .parallel.ep import ExpertParallel
from .execution.fb_pair import interleave
from .parallel.grid import Grid
from ..parallelism import Parallelism, ParallelismError
from .dtensor import is_dtensor
from .parallel.tp import TensorParallel
from .execution.executor import Executor, RankContext, StepOutcome
from .resilience.flight import NO_FLIGHT, SYNC, intervals
from .resilience.nonfinite import NonFiniteLoss, locate_nonfinite
from .stages.layers import as_layers, build_own_stages, split_counts
from .stages.names import Names, gather_stage_map
from .execution.recompute import Recompute, check_recompute, recompute_stages
from .parallel.replicas import Replicas
from .stages.stage import stage_ranges
from .execution.timing import CudaClock, WallClock, measured_timeline, named
from .launching.groups import meet


class RankSum:
    """A sum over every rank in flight (one all_reduce started, not waited for); ``value()`` waits once."""

    def __init__(self, values: list[float], device, flight=NO_FLIGHT, name: str = ""):
        self.t = torch.tensor(values, dtype=torch.float64, device=device)
        self.flight, self.name = flight, name  # the step end's collective: recorded when done
        self.work = dist.all_reduce(self.t, async_op=True)
        self._value: list[float] | None = None

    def value(self) -> list[float]:
        if self._value is None:
            t0 = time.perf_counter()
            self.work.wait()
            self._value = self.t.tolist()
            self.flight.done(self.name, time.perf_counter() - t0)
        return self._value


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One step (or evaluation) on this rank. ``loss`` is the step's mean loss over the whole batch, the same on
    every rank (None: no targets). ``step`` waits for the all-reduce behind it to check it is finite; with
    ``nonfinite="ignore"`` it is waited for only when ``loss`` is first read, so ranks need not meet at the end
    of a step whose loss nobody reads yet."""

    total: float | RankSum | None = field(default=None, repr=False)  #: the loss, or the sum computing it
    seconds: float  #: wall time of this rank's step: its program and the step-end gradient sums
    op_seconds: tuple[tuple[float, float], ...]  #: (start, end) of each op of this rank's program, from step start
    timeline: Timeline | None = None  #: every rank's measured ops, on rank 0 of ``step(..., timeline=True)``
    #: evaluation: the last stage's outputs of ``output_mbs``, concatenated (a list of them, one per micro-batch,
    #: where the micro-batches came as a list: their shapes may differ), else None
    outputs: Any = None
    output_mbs: tuple[int, ...] = ()  #: the micro-batches whose outputs this rank holds
    skipped: str | None = None  #: ``nonfinite="skip"``: where the non-finite loss came from; its gradients dropped

    @property
    def loss(self) -> float | None:
        return self.total.value()[0] if isinstance(self.total, RankSum) else self.total


#: what ``Pipeline(nonfinite=...)`` does with a NaN or infinite step loss
NONFINITE = ("raise", "skip", "ignore")


class PipelineBroken(RuntimeError):
    """A step failed part-way (an error on a rank inside the program): the pipeline cannot step again."""


class Pipeline:
    """This rank's part of a pipelined model, run by ``step`` inside the user's own training loop.

    Mutable: weights, the learned message shapes, accumulated gradients.

    - ``schedule``: a family name (``"1f1b"``, ``"zb-v"``, ``"dualpipe"``...) with ``microbatches`` (and
      ``chunks``), or any ``Schedule`` (generated, from ``plan``/``auto``, read from a torch CSV); its ranks
      times ``dp`` must be the world size.
    - ``slices``: sequence slices per micro-batch (``"seq1f1b"``, ``"seq1f1b-zb"``; a ``Schedule``'s own
      ``slices``): each micro-batch is cut along dimension 1 of its inputs and targets, and a slice attends to
      the keys and values of the slices before it (``stagewise.kv``, which the model's attention calls: the
      built-in GPT's and the HF adapter's do); loss and gradients are the unsliced run's.
    - ``model``: a sequence of layers, a ``Layers(count, build)`` factory called only for this rank's layers,
      or an ``nn.Module`` with ``split`` points (built on the meta device, materialized only here).
    - ``loss_fn(output, target)``: the mean loss of one micro-batch (a step's loss weighs each by its tokens,
      targets not -100, so it is the mean over the step's tokens; equal micro-batches: the mean of their means:
      ``stages/microbatches.py``).
    - ``split``: layers per stage of one model copy: counts, layout text (``"E+t*3 | t*4"``) or module names.
    - ``ties``: groups of parameter names that are one parameter, besides those found by identity.
    - ``dp``: data-parallel replicas of the pipeline (gradients all-reduced per stage); ``fsdp``: sharded data
      parallel (torch's FSDP2 on each stage, gathered and reduce-scattered where the schedule says;
      ``dp`` x ``fsdp`` is HSDP); ``tp``: tensor parallel inside each stage (world = ranks x dp x fsdp x ep x tp).
      Or ``mesh``, a DeviceMesh whose dimensions are named, in any order, from ``pp``, ``dp``, ``fsdp``,
      ``tp``, ``ep`` (``init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "fsdp"))``).
    - ``parallelism``: the layout as one ``stagewise.Parallelism`` instead of the sizes (its world must be the
      world size); ``pipe.parallelism`` is the layout run either way, ``pipe.grid`` the maker of its groups.
    - ``tp_plan``: module-name patterns to tensor-parallel styles (``{"layers.*.mlp.up_proj": "colwise"}``, the
      shape of transformers' ``base_model_tp_plan``; parallel/tp.py), or ``parallelize(stage_module, tp_mesh)``;
      default: the model's own (``Layers.tp_plan``: the HF adapter's and the built-in GPT's).
    - ``reshard_after_forward``: with ``fsdp``, free a stage's gathered weights after each forward (and gather
      them again for its backward) instead of keeping them until its last backward.
    - ``ep``: expert parallel (parallel/ep.py): the ``ep`` ranks of a pipeline rank take different rows, like
      replicas, and share each MoE block's experts (world = ranks x dp x ep; or an ``ep`` dimension of ``mesh``).
    - ``overlap``: how an F&B pair runs: None (default) interleaves its halves at the all-to-alls of
      expert-parallel MoE blocks when the rank holds any (execution/fb_pair.py), else forward then backward;
      False: always forward then backward; a function ``fn(pair)``: your own (it runs ``pair.forward.run()``
      and ``pair.backward.run()`` once each).
    - ``autocast``: a dtype (``torch.bfloat16``) to run forwards and the loss under ``torch.autocast``.
    - ``static_shapes``: boundary shapes never change (headers on the first step only: faster messages; not
      with micro-batches of different shapes).
    - ``measure_memory``: count the activation bytes each op holds (``meter``; activation_memory.py).
    - ``nonfinite``: a NaN or infinite loss ``"raise"``s ``NonFiniteLoss`` naming the step, micro-batch, stage
      and rank (the step's gradients are dropped first), ``"skip"``s the step (its gradients dropped,
      ``StepResult.skipped`` says where), or is ``"ignore"``d (the loss is then not waited for in ``step``).
    - ``seed``: what dropout draws from: each layer's forward of a micro-batch is seeded by (seed, step,
      micro-batch, layer) (stages/rng.py), so every schedule, split and recomputation draws the unpipelined
      model's masks over the same micro-batches; default: rank 0's ``torch.initial_seed()``. A resumed loop
      sets ``pipe.steps_done`` to the steps done, so the masks continue.
    - ``flight``: a ``resilience.flight.Recorder`` that keeps each op's and message's last events (for a crash
      report); default: none.

    Example (under ``torchrun --nproc-per-node 2``)::

        pipe = stagewise.Pipeline("1f1b", [nn.Linear(8, 8) for _ in range(4)], F.mse_loss, microbatches=4)
        opt = torch.optim.AdamW(pipe.parameters(), lr=1e-3)
        for x, y in batches:
            res = pipe.step(x, y)
            opt.step(); opt.zero_grad()
    """

    def __init__(self, schedule: str | Schedule, model, loss_fn: Callable, *, microbatches: int | None = None,
                 chunks: int | None = None, split=None, ties: Sequence[Sequence[str]] = (), dp: int = 1,
                 device: str | torch.device | None = None, recompute: bool | Sequence[int] = False,
                 autocast: torch.dtype | None = None, static_shapes: bool = False, timeout: float = 30.0,
                 init: Callable | None = None, measure_memory: bool = False, mesh=None, nonfinite: str = "raise",
                 flight=None, fsdp: int = 1, tp: int = 1, tp_plan=None, parallelize: Callable | None = None,
                 reshard_after_forward: bool = False, ep: int = 1, overlap: Callable | bool | None = None,
                 parallelism: Parallelism | None = None, seed: int | None = None, slices: int | None = None):
        check_timeout(timeout)
        if seed is not None:
            check_seed(seed)
        check_device(device)
        check_autocast(autocast)
        check_recompute(recompute)
        if nonfinite not in NONFINITE:
            raise RunError(f"`nonfinite` must be one of {', '.join(map(repr, NONFINITE))}; got {nonfinite!r}")
        if not callable(loss_fn):
            raise RunError(f"`loss_fn` must be a function (output, target) -> loss; got {type(loss_fn).__name__}")
        if not (overlap is None or overlap is False or callable(overlap)):
            raise RunError(f"`overlap` must be None, False or a function of the F&B pair; got {overlap!r}")
        self.spec = spec = as_layers(model, split, init, device)  # a model's own errors come before any rank's
        spec.check()
        rank, world = _process_group(timeout)
        self.device = _device(device)
        self.grid = grid = _grid(mesh, parallelism, {"dp": dp, "fsdp": fsdp, "tp": tp, "ep": ep}, world, rank,
                                 self.device)
        self.topo = topo = grid.topo
        self.schedule = sched = resolve_schedule(schedule, world=world, dp=topo.data_shards * topo.size("tp"),
                                                 microbatches=microbatches, chunks=chunks, slices=slices,
                                                 launched_by=f"a world of {world} ranks")
        self.loss_fn, self.timeout, self.nonfinite = loss_fn, timeout, nonfinite
        self.flight = flight if flight is not None else NO_FLIGHT
        counts = spec.split if spec.split is not None else split_counts(split, spec.all_names())
        ranges = stage_ranges(sched, spec.count, counts)
        self.stages, self.built_layers = build_own_stages(spec, ranges, sched.stages_of_rank(topo.pipe), self.device)
        meet("the pipeline's first exchange")  # every rank started and built its layers: slow when loaded
        if topo.size("fsdp") > 1 or topo.size("tp") > 1:
            grid.mesh  # torch's parts need a DeviceMesh: made first, so its groups are the only ones over its dims
        self.ep = ExpertParallel(grid, self.stages, self.device) if topo.size("ep") > 1 else None  # its experts only
        self.stage_map = gather_stage_map(sched, spec, ranges, self.stages, ties, ranks=topo.pipe_ranks)
        self.names = Names(spec, self.stage_map, sched, self.stages, topo.pipe)
        self.replicas = Replicas(self.stage_map, self.stages, sched.placement, topo.pipe, self.device, grid)
        self.replicas.make_equal()  # tied copies built apart start from one value
        self.tensor_parallel = self.sharded = None
        if topo.size("tp") > 1:
            self.tensor_parallel = TensorParallel(self.stages, spec.prefix, grid.sub_mesh("tp"), sizes=spec.tp_divides,
                                                  plan=tp_plan if tp_plan is not None or parallelize else spec.tp_plan,
                                                  parallelize=parallelize, strict=tp_plan is not None)
        if topo.size("fsdp") > 1:
            shard = grid.sub_mesh(("dp", "fsdp") if topo.dp > 1 else "fsdp")  # HSDP: replicate over dp
            self.sharded = Sharded(self.stages, shard, reshard_after_forward=reshard_after_forward
                                   or grid.parallelism.reshard_after_forward, flight=self.flight)
        #: the layout the schedule is lowered under (execution/program.py): the grid's, resharding as the stages do
        self._lowered_as = dataclasses.replace(grid.parallelism, reshard_after_forward=True) \
            if self.sharded is not None and self.sharded.raf else grid.parallelism
        self.replicas.capture()  # FSDP and tensor parallel made the parameters DTensors
        self.dp = self.ep.reduction(grid, self.stages, timeout) if self.ep is not None else \
            DataParallel(grid, sched, self.stages, timeout) if topo.dp > 1 and self.sharded is None else None
        self.replicas.flight = self.flight
        if self.dp is not None:
            self.dp.flight = self.flight
        self._overlap = _overlap_hook(overlap, self.ep)
        self.recompute = recompute_stages(recompute, sched.stages)
        if self.recompute and sched.slices > 1:
            raise RunError(f"`recompute` with {sched.slices} sequence slices: a replayed slice would attend to "
                           "keys and values kept without their graph; run sliced schedules without `recompute`")
        self.clock = CudaClock(self.device) if self.device.type == "cuda" else WallClock()
        self.meter = ActivationMeter(self.stages) if measure_memory else None
        self._autocast = (lambda: torch.autocast(self.device.type, dtype=autocast)) if autocast else None
        self._static = static_shapes
        self._plans: dict = {}  # (forward only, headers) -> the rank's lowered program
        self._headed: set = set()  # the executors that ran a step with headers (static shapes: learned)
        self.executor = Executor(self._context(sched, forward_only=False))
        self._evaluator: Executor | None = None
        self.params = [p for st in self.stages.values() for p in st.parameters()]
        self.last_outcome: StepOutcome | None = None  #: the executor's view of the last step (per-mb losses)
        #: steps run (each ``step`` call): messages and dropout's seeds; a resumed loop sets it to the steps done
        self.steps_done = 0
        self.seed = _agreed_seed(seed, self.device)  #: what dropout draws from (stages/rng.py)
        self._broken: str | None = None  # why the last step failed part-way (messages and activations are lost)
        self._rows: tuple | None = None  # the batch rows every rank agreed on (static_shapes: checked once)

    # ---- the step

    def step(self, inputs, targets, *, timeline: bool = False) -> StepResult:
        """Run this rank's program on one step's batch; gradients add into ``.grad`` (like ``loss.backward()``).

        ``inputs`` / ``targets``: the whole step's batch (a tensor or pytree, split into micro-batches along
        dimension 0; with ``dp`` each replica takes its rows), or a ``list`` of the step's micro-batches each
        (pytrees whose shapes may differ: sequence length, rows; each cut into the data shards' rows); with
        sequence slices each micro-batch is cut along dimension 1 too. Either way each micro-batch's (unit's)
        loss counts by its tokens (``stages/microbatches.py``). A rank without a first stage may pass None
        as ``inputs``, one without a last stage None as ``targets``. ``timeline``: gather every rank's op times
        into a measured Timeline on rank 0 (a collective: every rank passes the same).
        """
        self._check_usable()
        microbatches.check(inputs, targets, self.schedule.microbatches // self.schedule.slices, self.topo.data_shards)
        varying = self._check_rows(inputs, targets, self._varies(inputs))
        xs, ys = self._micro(inputs, "inputs"), self._micro(targets, "targets")
        scales = self._scales(targets)
        self._use(self.executor, False, varying)
        earlier = self._stash_grads()  # gradient accumulation: this step's gradients are summed alone
        self.steps_done += 1
        if timeline:
            dist.barrier()  # ranks start together, so their op times line up
        self.flight.reset_comms()
        self.clock.start()
        self._host0 = time.perf_counter()  # the collectives' times are host times from here (the clock's origin)
        t0 = self.clock.mark()
        try:
            if self.sharded is not None:
                self.sharded.start_step()
            done = self.last_outcome = self.executor.step(xs, ys, scales)  # its end waits for and sums the gradients
        except BaseException as e:
            self._broken = f"{type(e).__name__}: {e}"  # messages in flight and saved activations are lost
            raise
        end = f"{min(self.stages, default=0)}STEP_END"
        self.flight.comm(end)
        total = RankSum([done.loss if self._counts_loss else 0.0], self.device, self.flight, end)
        skipped = None if self.nonfinite == "ignore" else self._check_finite(total.value()[0], done, earlier)
        for p, g in earlier:
            p.grad = g if p.grad is None else p.grad.add_(g)
        res = self._result(total, done, t0, timeline)
        return dataclasses.replace(res, skipped=skipped) if skipped else res

    @torch.no_grad()
    def eval_step(self, inputs, targets=None) -> StepResult:
        """Forward only (each rank's F's in program order): the mean loss when ``targets`` are given, and on a
        rank holding a last stage its outputs (``StepResult.outputs``). No gradient is formed. ``inputs`` and
        ``targets`` as ``step`` takes them (one batch, or lists of micro-batches)."""
        if self._evaluator is None:
            self._evaluator = Executor(self._context(self.schedule.forward_only(), forward_only=True))
        split = microbatches.check(inputs, targets, self.schedule.microbatches // self.schedule.slices,
                                   self.topo.data_shards)
        varying = self._varies(inputs)
        if not self._static:  # every rank lowers the same headers: one small sum says whether any varies
            flag = torch.tensor([float(varying)], dtype=torch.float64, device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            varying = bool(flag.item())
        xs, ys = self._micro(inputs, "inputs"), self._micro(targets, "targets")
        scales = self._scales(targets)
        self._use(self._evaluator, True, varying)
        self.clock.start()
        t0 = self.clock.mark()
        done = self._evaluator.step(xs, ys, scales)
        has = bool(done.mb_losses) and self._counts_loss
        loss, counted = RankSum([done.loss if has else 0.0, float(has)], self.device).value()
        k = self.schedule.slices
        mbs = tuple(sorted({u // k for u in done.outputs}))
        whole = [kv.join([done.outputs[m * k + j] for j in range(k)]) if k > 1 else done.outputs[m] for m in mbs]
        outs = None if not mbs else whole if split else _concat(whole)
        res = self._result(loss if counted else None, done, t0, False)
        return StepResult(total=res.total, seconds=res.seconds, op_seconds=res.op_seconds, outputs=outs,
                          output_mbs=mbs)

    # ---- around the step

    def parameters(self) -> list[nn.Parameter]:
        """This rank's parameters, for the optimizer (each copy of a tied or duplicated one: they stay equal)."""
        return list(self.params)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(original model name, parameter) of each parameter here (a copy repeats its logical name)."""
        for logical, holders in self.stage_map.params.items():
            for p in self.names.local(holders):
                yield self.original_name(logical), p

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale every rank's gradients so the global norm (each logical parameter once) is at most
        ``max_norm``; returns the norm before clipping (``torch.nn.utils.clip_grad_norm_``'s rule; collective)."""
        check_positive_number("`max_norm`", max_norm)
        return self.replicas.clip(self.params, max_norm, sharded=(self.ep.sharded, self.ep.group) if self.ep else None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def train(self, mode: bool = True) -> "Pipeline":
        """Training mode for this rank's layers (dropout on, norms update statistics)."""
        for st in self.stages.values():
            st.train(mode)
        return self

    def eval(self) -> "Pipeline":
        return self.train(False)

    # ---- state, keyed by the original model's names

    def original_name(self, logical: str) -> str:
        """``3.fc.weight`` (layer 3's ``fc.weight``) -> its name in the original model (``blocks.2.fc.weight``)."""
        return self.names.original(logical)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's parameters and persistent buffers under their original names (a tied parameter under
        each of its names); sharded ones (``fsdp``, ``tp``) as DTensors. The union over the ranks is the whole
        model's, so torch.distributed.checkpoint's conventions hold: every rank ``dcp.save``s its
        ``{"model": pipe.state_dict(), "optim": pipe.optimizer_state_dict(opt)}``, and to resume under any
        layout ``dcp.load``s into the same dicts, then ``load_state_dict`` / ``load_optimizer_state_dict``."""
        return self.names.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load this rank's parameters and buffers from a state_dict keyed by the original names: a whole
        model's (each sharded parameter takes its own shard), any part holding this rank's names, or what
        ``dcp.load`` filled into ``state_dict()``; ``strict``: every one of them must be there."""
        self.names.load(state, strict, self.topo.rank)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict:
        """``optimizer``'s state of this rank's parameters, flattened as DCP's ``get_state_dict`` flattens it
        (``state.NAME.exp_avg``, ``param_groups.NAME.lr``; NAME the original name), so it reshards onto any
        layout. Initialises a stateless optimizer first (zero gradients, lr 0), to give a load its tensors.
        A ``ZeroRedundancyOptimizer`` gives its partition's state."""
        return self.names.optimizer_state_dict(optimizer)

    def load_optimizer_state_dict(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Set ``optimizer``'s state of every local copy of each parameter from ``optimizer_state_dict``'s form
        (param groups' values included)."""
        self.names.load_optimizer_state_dict(optimizer, state)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state_dict (whole CPU tensors) on every rank: loads into the unpipelined model.
        A collective (sharded parameters are gathered first)."""
        mine = self.names.owned_state_dict()
        mine = gather_full(self.ep.gather_full(mine) if self.ep is not None else mine)
        first = all(self.topo.coords.get(d, 0) == 0 for d in ("dp", "fsdp", "tp"))
        mine = {k: v.cpu() for k, v in mine.items()} if first else {}
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        return {k: v for part in gathered for k, v in part.items()}

    def group(self, dim: str):
        """The process group of this rank along a dimension of the grid (``"dp"``: the one the dp reduction
        sums over, what a ``ZeroRedundancyOptimizer`` shards its state over; ``"tp"``, ``"fsdp"``, ``"ep"``,
        ``"pp"``). Every rank calls it alike the first time (it may make the groups: a collective)."""
        if dim not in self.topo.dims:
            raise RunError(f"`dim` {dim!r} is not a dimension of this pipeline's grid ({self.topo.describe()})")
        return self.grid.group(dim)

    def zero_optimizer(self, optimizer_class: type = torch.optim.AdamW, **defaults) -> torch.optim.Optimizer:
        """ZeRO-1 of this rank's parameters over the dp group (``group("dp")``): torch's
        ``ZeroRedundancyOptimizer`` of ``optimizer_class(..., **defaults)``, its parameter broadcast taking a
        tensor-parallel parameter's local shard (parallel/dp.py)."""
        from .parallel.dp import zero_optimizer

        return zero_optimizer(self.parameters(), optimizer_class, self.group("dp"), **defaults)

    @property
    def mesh(self):
        """The grid's torch DeviceMesh: the one given as ``mesh`` (the same object), or the one made for
        tensor parallel or FSDP; None when no part needed one (pipelines and replicas only)."""
        return self.grid.made_mesh

    @property
    def parallelism(self) -> Parallelism:
        """The layout this pipeline runs (``stagewise.Parallelism``: pp, dp, fsdp, tp, ep)."""
        return self.grid.parallelism

    @property
    def _counts_loss(self) -> bool:
        """This rank's losses enter the step's loss: tensor-parallel ranks of a stage compute the same one, so
        only the first of them counts it."""
        return self.topo.coords.get("tp", 0) == 0

    # ---- internals

    def _lower(self, sched: Schedule, forward_only: bool, headers: str):
        """This rank's program of ``sched`` (kept per headers rule)."""
        key = (forward_only, headers)
        if key in self._plans:
            return self._plans[key]
        exchanging = self.ep.exchanging if self.ep is not None else frozenset()
        # a tie the lowering's rule names (copies on the lane ends; DualPipe's two copies of a stage) is summed by
        # its TIE_GRADs, where they are every rank set holding copies; otherwise the step's end sums every copy
        tie = not forward_only and self.replicas.ties_lane_ends(sched.lanes)
        plan = lower(sched, self.topo.pipe, self._lowered_as, exchanging=exchanging, tie=tie, headers=headers)
        if tie and plan.tie_sets != self.replicas.sets:
            plan = lower(sched, self.topo.pipe, self._lowered_as, exchanging=exchanging, headers=headers)
        self._plans[key] = plan
        return plan

    def _use(self, executor: Executor, forward_only: bool, varying: bool) -> None:
        """The program this step walks: every message headed when the micro-batches' shapes differ, none once
        static shapes are learned, else the first of each boundary (the shapes of a step's others)."""
        headers = "every" if varying else "none" if self._static and executor in self._headed else "first"
        if headers != "none":
            self._headed.add(executor)
        sched = self.schedule.forward_only() if forward_only else self.schedule
        executor.use(self._lower(sched, forward_only, headers))

    def _varies(self, inputs) -> bool:
        """This rank's input micro-batches differ in shape (refused with static shapes)."""
        varying = microbatches.varies(inputs)
        if varying and self._static:
            raise RunError("`inputs`: micro-batches of different shapes, but `static_shapes` promises one shape "
                           "for every message; drop `static_shapes` or pass micro-batches of one shape")
        return varying

    def _context(self, sched: Schedule, forward_only: bool) -> RankContext:
        plan = self._lower(sched, forward_only, "first")
        ties = not forward_only and bool(plan.tie_sets) and plan.tie_sets == self.replicas.sets
        if not forward_only:
            self._tie_actions = ties
        p2p = P2P(plan.messages, self.topo.pipe, self.device, self.timeout, tags=dist.get_backend() == "gloo",
                  peers=self.topo.pipe_ranks, static=self._static, flight=self.flight)
        tp = self.tensor_parallel
        return RankContext(plan=plan, stages=self.stages, p2p=p2p,
                           loss=self._loss, clock=self.clock, autocast=self._autocast, forward_only=forward_only,
                           recompute=None if forward_only else Recompute(self.recompute, self.device),
                           meter=None if forward_only else self.meter, sharded=self.sharded,
                           reducers=tuple(x for x in (self.sharded, self.dp) if x is not None),
                           complete=tp.complete if tp is not None and any(tp.partial.values()) and not forward_only
                           else None,
                           end=self._finish_eval if forward_only else self._finish_grads, flight=self.flight,
                           tie=self.replicas.tie if ties else None,
                           overlap=None if forward_only else self._overlap, draws=self._draws)

    def _draws(self, mb: int):
        """Micro-batch ``mb``'s forward here: dropout seeded by (seed, step, micro-batch over every replica,
        layer), whatever the schedule (stages/rng.py)."""
        step = max(self.steps_done - 1, 0)  # ``step`` counts itself before its program runs
        return rng.forward(self.seed, step, self.topo.data_index * self.schedule.microbatches + mb, self.device)

    def _finish_grads(self) -> None:
        """The step's end (the executor's, after its sends): the reductions waited for, the copies summed."""
        self.flight.event(SYNC, "gradients and loss")
        self._finish_eval()
        if self.dp is not None:
            self.dp.finish()
        if self._tie_actions:  # the program's TIE_GRADs sum the copies across ranks
            self.replicas.sum_local()
        else:
            self.replicas.sync_grads()

    def _finish_eval(self) -> None:
        if self.sharded is not None:
            self.sharded.finish()

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise PipelineBroken(f"this Pipeline failed part-way through step {self.steps_done} ({self._broken}); "
                                 "the messages in flight and the activations it held are lost on every rank, so it "
                                 "cannot run another step: build a new Pipeline (the weights are as they were "
                                 "before that step)")

    def _check_rows(self, inputs, targets, varying: bool = False) -> bool:
        """Every rank passes the same step's batch: its rows (dimension 0 of the first leaf, summed over
        micro-batches given as a list) must agree, or a last stage's targets would not line up with a first
        stage's inputs (one small all_reduce; with ``static_shapes`` the first step only). Whether any rank's
        micro-batches differ in shape (``varying`` here): every rank then lowers headers on every message."""
        rows = (_rows(inputs), _rows(targets))
        if self._static and self._rows == rows:
            return varying
        seen = torch.tensor([[r if r is not None else -1 for r in rows] + [int(varying)],
                             [-(r if r is not None else 1 << 62) for r in rows] + [0]], dtype=torch.int64)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        high, low = seen[0].tolist(), [-x for x in seen[1].tolist()]
        for k, what in enumerate(("inputs", "targets")):
            mine = rows[k]
            if high[k] >= 0 and low[k] != high[k]:
                raise RunError(f"rank {self.topo.rank}: step {self.steps_done + 1}'s {what} have {mine} rows here "
                               f"but between {low[k]} and {high[k]} on other ranks; every rank passes the same "
                               f"step's batch (or None where it holds no first / last stage)")
        self._rows = rows
        return bool(high[2])

    def _check_finite(self, loss: float, done: StepOutcome, earlier) -> str | None:
        """The ``nonfinite`` policy on a NaN or infinite step loss (every rank sees the same all-reduced value, so
        every rank takes the same branch): None when finite."""
        if math.isfinite(loss):
            return None
        where = locate_nonfinite(self.topo.rank, done.mb_losses)
        self.zero_grad()  # this step's gradients are unusable; the earlier steps' come back
        if self.nonfinite == "raise":
            for p, g in earlier:
                p.grad = g
            raise NonFiniteLoss(f"step {self.steps_done}: the loss is {loss}{where}; stopped (to skip such a step's "
                                "update and go on instead: `nonfinite`)")
        return where.removeprefix(" at ") or "?"

    def _loss(self, output, target):
        """The user's loss (a scalar), divided by the data shards: summed over them it is the whole batch's mean."""
        loss = self.loss_fn(output, target)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise RunError(f"`loss_fn` returned {shape}; it must return the mean loss of a micro-batch as a scalar "
                           "tensor (reduce it, e.g. .mean())")
        n = self.topo.data_shards
        return loss / n if n > 1 else loss

    def _scales(self, targets) -> list[float] | None:
        """What each of this replica's unit losses counts in the step's: its tokens among the step's, over every
        data shard (``stages/microbatches.py``); None on a rank without targets."""
        if targets is None:
            return None
        pieces = [self._units(targets, d, "targets") for d in range(self.topo.data_shards)]
        return microbatches.shares(microbatches.by_shard(pieces), self.topo.data_index)

    def _units(self, tree, shard: int, what: str) -> list:
        """Data shard ``shard``'s piece of a step's batch for each unit of the schedule: its rows of each given
        micro-batch, or its rows cut into equal micro-batches; with sequence slices each cut along dimension 1
        (``stages/kv.py``)."""
        shards, k = self.topo.data_shards, self.schedule.slices
        if microbatches.is_split(tree):  # checked (``microbatches.check``)
            parts = microbatches.shard(tree, shards, shard, what)
        else:
            if shards > 1:
                tree = pytree.split(tree, shards, what)[shard]
            parts = pytree.split(tree, self.schedule.microbatches // k, what)
        if k > 1:
            parts = [piece for part in parts for piece in kv.cut(part, k, what)]
        return parts

    def _micro(self, tree, what: str) -> list | None:
        """A step's batch as this replica's units (micro-batches, or their sequence slices), on its device."""
        if tree is None:
            return None
        parts = self._units(tree, self.topo.data_index, what)
        parts = [pytree.map_tensors(lambda t: t.to(self.device, non_blocking=True), part) for part in parts]
        if self.meter is not None:  # a storage per unit, so the meter counts each one's tokens apart
            parts = [pytree.map_tensors(torch.Tensor.clone, part) for part in parts]
        return parts

    def _stash_grads(self) -> list:
        """Take the gradients earlier steps left (restored after this step's sums)."""
        out = [(p, p.grad) for p in self.params if p.grad is not None]
        for p, _ in out:
            p.grad = None
        return out

    def _result(self, loss, done: StepOutcome, t0, timeline: bool) -> StepResult:
        t1 = self.clock.mark()
        marks = self.clock.seconds(done.marks + [(t0, t1)])
        tl = None
        if timeline:
            gathered = [None] * dist.get_world_size() if self.topo.rank == 0 else None
            mine = (marks[:-1], named(intervals(self.flight.comms, self._host0), self.executor.plan.program))
            dist.gather_object(mine, gathered, dst=0)
            if self.topo.rank == 0:
                per = gathered[:self.topo.p]  # replica 0
                tl = measured_timeline(self.schedule, [m for m, _ in per],
                                       [c for _, c in per] if self.flight is not NO_FLIGHT else None)
        return StepResult(total=loss, seconds=marks[-1][1] - marks[-1][0], op_seconds=tuple(marks[:-1]),
                          timeline=tl)

def _process_group(timeout: float) -> tuple[int, int]:
    """(rank, world): the existing process group, or one made from torchrun's environment."""
    if not dist.is_initialized():
        from datetime import timedelta

        from .launching.groups import close_groups, default_backend, init_torchrun, is_torchrun

        if not is_torchrun():
            raise RunError("no process group: run the script under torchrun (torchrun --nproc-per-node N "
                           "script.py), start it with stagewise.launch(fn, ranks=N), or call "
                           "torch.distributed.init_process_group first")
        init_torchrun(default_backend(), timedelta(seconds=timeout))  # as `train` does: a restart's own keys
        atexit.register(close_groups)  # gloo threads joined while the interpreter is alive (groups.py)
    return dist.get_rank(), dist.get_world_size()


def _grid(mesh, parallelism: Parallelism | None, degrees: dict[str, int], world: int, rank: int, device) -> Grid:
    """This rank's grid: the user's named DeviceMesh, a ``Parallelism``, or ``degrees`` (dp, fsdp, tp, ep) with
    pp the rest of the world; refused (``RunError``) when the layout does not hold or is not run here."""
    given = [f"`{k}`" for k, v in degrees.items() if v != 1]
    if (mesh is not None or parallelism is not None) and given:
        raise RunError(f"give either `{'mesh' if mesh is not None else 'parallelism'}` or {', '.join(given)}, not "
                       "both (the mesh's dimensions are the sizes)")
    if mesh is not None and parallelism is not None:
        raise RunError("give either `mesh` or `parallelism`, not both")
    if mesh is not None and not hasattr(mesh, "mesh_dim_names"):
        raise RunError(f"`mesh` must be a torch DeviceMesh with named dimensions (init_device_mesh(device, shape, "
                       f"mesh_dim_names=...)); got {type(mesh).__name__} {mesh!r}")
    try:
        if mesh is not None:
            grid = Grid.of_mesh(mesh, world, rank)
        else:
            if parallelism is None:
                parallelism = Parallelism.of_world(world, **degrees)
            elif not isinstance(parallelism, Parallelism):
                raise RunError(f"`parallelism` must be a stagewise.Parallelism; got {type(parallelism).__name__}")
            parallelism.check()
            if parallelism.world != world:
                raise RunError(f"`parallelism` {parallelism.describe()} is {parallelism.world} ranks; the world has "
                               f"{world}: the degrees must multiply to the world size")
            grid = Grid.of_parallelism(parallelism, rank, device.type)
    except ParallelismError as e:
        raise RunError(str(e)) from None
    why = grid.parallelism.unsupported()
    if why:
        raise RunError(f"{grid.describe()}: {why}")
    return grid


def gather_full(state: dict) -> dict:
    """Each DTensor of ``state`` as its whole tensor (a collective over its mesh: every rank holding a shard of
    it calls this with the same names in the same order), the others as they are."""
    import logging

    log = logging.getLogger("torch.distributed.tensor._redistribute")
    level = log.level
    log.setLevel(logging.ERROR)  # FSDP over tp gathers in two steps, which torch warns of on every tensor
    try:
        return {k: v.full_tensor() if is_dtensor(v) else v for k, v in state.items()}
    finally:
        log.setLevel(level)


def _overlap_hook(overlap, ep) -> Callable | None:
    """What runs each F&B pair (``Pipeline(overlap=...)``): the user's function, the generic interleave where
    MoE blocks communicate over an ep group, or None (forward, then backward)."""
    if overlap is False:
        return None
    if callable(overlap):
        return overlap
    return interleave if ep is not None and ep.blocks else None


def _agreed_seed(seed: int | None, device) -> int:
    """``seed``, or rank 0's ``torch.initial_seed()`` on every rank (a collective: ranks of one stage must draw
    one dropout mask)."""
    if seed is not None:
        return seed
    t = torch.tensor([rng.default_seed()], dtype=torch.int64,
                     device=device if dist.get_backend() == "nccl" else "cpu")
    dist.broadcast(t, src=0)
    return int(t.item())


def _rows(tree) -> int | None:
    """Rows of a step's batch: dimension 0 of its first tensor leaf, summed over micro-batches given as a list
    (None: nothing passed)."""
    if tree is None:
        return None
    if microbatches.is_split(tree):
        return sum(_rows(mb) or 0 for mb in tree)
    leaves = [t for t in pytree.tensors(tree) if t.dim() > 0]
    return int(leaves[0].shape[0]) if leaves else None


def _device(device) -> torch.device:
    """The given device, else the rank's GPU under NCCL (LOCAL_RANK), else the CPU. A GPU becomes the current
    device: NCCL's object collectives (the names gathered at construction) run on it."""
    if device is not None:
        d = torch.device(device)
    elif dist.get_backend() == "nccl":
        d = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    else:
        d = torch.device("cpu")
    if d.type == "cuda":
        torch.cuda.set_device(d)
    return d


def _concat(trees: list):
    """Micro-batch outputs joined along dimension 0, leaf by leaf."""
    leaves = [pytree.flatten(t)[0] for t in trees]
    spec = pytree.flatten(trees[0])[1]
    cols = [torch.cat(col) if isinstance(col[0], torch.Tensor) and col[0].dim() else col[0] for col in zip(*leaves)]
    return pytree.unflatten(spec, cols)
