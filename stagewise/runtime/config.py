"""What one training run is: a frozen, picklable config (it travels to every rank).

No torch here, so options are checked before any process starts.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, Sequence, runtime_checkable

from .. import limits
from ..errors import StagewiseError
from ..memory_actions import RECOMPUTE_AT
from ..parallelism import Parallelism, ParallelismError


class RunError(StagewiseError):
    """Bad input to a run (the message names the option, the value and the rule)."""


#: the ``collect`` items a run can return besides losses and timings (tests use them)
COLLECT = ("grads", "params")


def default_batch(microbatches: int, dp: int = 1) -> int:
    """The default sequences per step: at least 8, whole micro-batches on each replica (the one rule)."""
    share = microbatches * dp
    return share * -(-8 // share)


def check_batch(batch: int, microbatches: int, dp: int = 1, fsdp: int = 1, ep: int = 1) -> None:
    """``batch`` splits into ``microbatches`` equal micro-batches on each of the ``dp`` x ``fsdp`` x ``ep`` data
    shards (the one rule: replicas, sharded and expert-parallel ranks take different rows)."""
    share = microbatches * dp * fsdp * ep
    if batch % share:
        shards = " x ".join(f"`{k}` {v}" for k, v in (("dp", dp), ("fsdp", fsdp), ("ep", ep)) if v > 1)
        into = (f"{shards} replicas of `microbatches` {microbatches}" if dp * fsdp * ep > 1 else
                f"`microbatches` {microbatches}")
        raise RunError(f"`batch` {batch} does not split into {into} equal micro-batches; use a `batch` that is a "
                       f"multiple of {share}")


def check_count(option: str, value, low: int = 1, limit=None) -> None:
    """A whole number ``>= low`` within ``limit`` (a ``limits.Limit``), else ``RunError`` naming the option and
    the rule (``option`` in backticks: errors.py). A bool, a string or a float is refused as what it is."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise RunError(f"{option} must be a whole number; got {value!r} ({type(value).__name__})")
    if value < low:
        raise RunError(f"{option} must be >= {low}; got {value}")
    if limit is not None:
        limit.check(value, option)


def check_positive_number(option: str, value: float, limit=None) -> None:
    """A finite number > 0 (within ``limit``): nan and inf are refused, naming the option."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise RunError(f"{option} must be a finite number > 0; got {value!r}")
    if limit is not None:
        limit.check(value, option)


def check_divides(tp: int, sizes) -> None:
    """``tp`` must divide each size tensor parallel splits (``(("attention heads", 4), ...)``)."""
    for what, n in sizes:
        if n % tp:
            raise RunError(f"`tp` {tp} does not divide the model's {n} {what}: tensor parallel gives each tp rank "
                           f"the same number of them; use a `tp` that divides {n}")


def check_timeout(value: float) -> None:
    """``timeout``: seconds a rank waits for a peer, > 0 and within the TIMEOUT limit."""
    check_positive_number("`timeout`", value, limits.TIMEOUT)


@runtime_checkable
class ModelConfig(Protocol):
    """The one model interface of a config-driven run: what ``RunConfig.model`` holds, what ``stagewise profile``
    measures (``profiling.measure.profile_model``) and ``plan --verify`` runs. Picklable when it travels to spawned
    ranks. ``models.GPTConfig`` (the built-in GPT) and ``models.LayerModel`` (layers you built) are two.

    Optional, read where present: ``name`` (the profile's model name), ``symbols`` (layout letters, default
    ``E t.. H``), ``layer_names()``, ``profile_meta()`` (how to rebuild it, kept in a profile), ``check()``.
    """

    @property
    def num_layers(self) -> int: ...

    def layers(self) -> Sequence[Any]:
        """The layer sequence (``nn.Module`` each), freshly built."""

    def batch(self, step: int, size: int) -> tuple[Any, Any]:
        """Step ``step``'s ``size`` samples: (inputs, targets). A model with ``pack`` true is called
        ``batch(step, size, shares=(data-parallel shares, micro-batches))`` (``RunConfig.step_batch``)."""

    def loss(self, output: Any, target: Any) -> Any:
        """The scalar loss of the last layer's ``output``."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run: schedule, model, data and optimizer settings."""

    schedule: Any = "1f1b"  #: family name or a Schedule value; None runs the unpipelined reference
    csv: str | None = None  #: read the schedule from torch's compute-only CSV instead
    #: the layout (``stagewise.Parallelism``: pp = ``ranks``, dp, fsdp, tp, ep, zero, reshard_after_forward);
    #: the constructor also takes those as keywords (``RunConfig(ranks=2, dp=2)``), over ``parallelism``'s
    parallelism: Parallelism = Parallelism(pp=4)
    microbatches: int = 8  #: m
    chunks: int | None = None  #: v (family default when None)
    #: sequence slices per micro-batch (a family with slices: seq1f1b, seq1f1b-zb; the model's `seq` a multiple)
    slices: int = 1
    overlap: bool = True  #: interleave F&B pairs at the MoE all-to-alls (execution/fb_pair.py); False: F then B
    measure_memory: bool = True  #: count activation bytes per rank (costs ~1-15% of a small model's step)
    recompute: bool | tuple[int, ...] = False  #: recompute the forward in the backward: all stages, or these
    #: where `recompute`'s stages redo their forward: "backward" (right before it) or "bubble" (a RECOMPUTE action
    #: placed into the rank's idle time before it: stagewise.memory_actions)
    recompute_at: str = "backward"
    #: offload the saved activations to host memory after each forward and reload them before the backward (OFFLOAD
    #: and RELOAD actions placed by stagewise.memory_actions): all stages, or these
    offload: bool | tuple[int, ...] = False
    steps: int = 1  #: optimizer steps
    batch: int = 8  #: sequences per step (split into m micro-batches)
    model: ModelConfig | None = None  #: the model and its data (``ModelConfig``: models.GPTConfig, LayerModel...)
    split: Any = None  #: layers per stage of one model copy: a Split, counts (3,5) or layout text; None = even
    lr: float = 1e-3
    optimizer: str = "adamw"  #: any torch.optim class name, case-insensitive
    clip: float | None = None  #: clip the global gradient norm to this value
    timeout: float = 30.0  #: seconds any rank waits for a message or a collective: the bound on a stalled peer
    threads: int | None = None  #: torch threads per rank; default: cores / ranks
    collect: tuple[str, ...] = field(default=())  #: extra results: "grads" (after step 1), "params" (at the end)
    save: str | None = None  #: checkpoint folder: a step-NNNNNNNN folder every save_every steps and at the end
    save_every: int | None = None  #: steps between checkpoints (None: at the end only)
    resume: str | None = None  #: continue from this checkpoint (a --save folder: its newest complete one)
    overwrite: bool = False  #: let ``save`` replace another run's checkpoints (deleted at the first save)
    skip_nonfinite: bool = False  #: a nan/inf loss skips that step's update on every rank instead of stopping
    save_on_signal: float | None = None  #: SIGTERM: finish the step, save within this many seconds, exit 143
    max_restarts: int = 0  #: a failed rank restarts every rank from the last complete checkpoint, this often
    elastic: tuple[int, int] | None = None  #: (MIN, MAX) ranks: a restart on fewer re-plans the layout
    #: the restart loop's: rank slots come back once this many steps are done, so the ranks stop after the first
    #: checkpoint saved then and the run goes on at the larger layout from it (run/restart.py); None: never
    grow_after: int | None = None
    fault: str | None = None  #: tests only: a rank fails on purpose, e.g. "exit:rank=1:action=1F3" (faults.py)

    # ---- the layout's degrees, read from ``parallelism`` (one home)

    @property
    def ranks(self) -> int:
        """p, the ranks of one pipeline (``parallelism.pp``)."""
        return self.parallelism.pp

    dp = property(lambda self: self.parallelism.dp, doc="pipeline replicas (data parallel)")
    fsdp = property(lambda self: self.parallelism.fsdp, doc="sharded data parallel (FSDP2; with dp > 1: HSDP)")
    tp = property(lambda self: self.parallelism.tp, doc="tensor parallel inside each stage")
    ep = property(lambda self: self.parallelism.ep, doc="expert-parallel ranks per pipeline rank")
    zero = property(lambda self: self.parallelism.zero, doc="1: ZeRO-1 over the dp replicas")
    reshard_after_forward = property(lambda self: self.parallelism.reshard_after_forward,
                                     doc="with fsdp: free each layer after its forward and backward")

    def layer_split(self):
        """``split`` as a ``Split`` (plan.layout), text read against the model's ``symbols`` when it has them;
        None: even. Raises ``RunError`` naming `split`."""
        if self.split is None:
            return None
        from ..split import LayoutError, Split

        if isinstance(self.split, Split):
            return self.split
        try:
            if isinstance(self.split, str):
                return Split.parse(self.split, getattr(self.model, "symbols", None) or self.model.num_layers)
        except LayoutError as e:
            raise RunError(f"`split` {self.split}: {str(e).removeprefix('`layout` ')}") from None
        try:
            return Split(tuple(self.split))
        except LayoutError as e:
            raise RunError(f"`split` {e}") from None

    @property
    def shards(self) -> int:
        """The shares a step's batch is cut into across ranks: dp x fsdp x ep (tp ranks take the same rows)."""
        return self.parallelism.data_shards

    @property
    def world(self) -> int:
        """Ranks launched: p x dp x fsdp x ep x tp."""
        return self.parallelism.world

    @property
    def pipelined(self) -> bool:
        """Runs on ranks (p x dp x fsdp x ep x tp > 1), not as the in-process reference."""
        return (self.schedule is not None or self.csv is not None) and self.world > 1

    def step_batch(self, step: int) -> tuple[Any, Any]:
        """Step ``step``'s (inputs, targets) from the model. A model that packs documents (``model.pack``) is
        told the shares its rows are dealt to, (data-parallel shares, micro-batches), to balance their tokens."""
        if not getattr(self.model, "pack", False):
            return self.model.batch(step, self.batch)
        shards = self.shards if self.pipelined else 1
        m = self.microbatches if self.batch % (self.microbatches * shards) == 0 else 1
        return self.model.batch(step, self.batch, shares=(shards, m))

    def check(self) -> None:
        """Checks that need neither torch nor the schedule; raise ``RunError``."""
        if not isinstance(self.parallelism, Parallelism):
            raise RunError(f"`parallelism` must be a stagewise.Parallelism; got {type(self.parallelism).__name__}")
        check_count("`ranks`", self.ranks, 1, limits.RANKS)
        for name in ("dp", "fsdp", "tp", "ep"):  # before the batch they divide
            check_count(f"`{name}`", getattr(self, name), 1, limits.RANKS)
        check_count("`microbatches`", self.microbatches, 1, limits.MICROBATCHES)
        check_count("`batch`", self.batch, 1, limits.BATCH)
        check_count("`steps`", self.steps, 1)
        if self.chunks is not None:
            check_count("`chunks`", self.chunks, 1, limits.CHUNKS)
        self._check_slices()
        if self.threads is not None:
            check_count("`threads`", self.threads, 1, limits.THREADS)
        seq = getattr(self.model, "seq", 1)
        if isinstance(seq, int) and seq >= 1:
            limits.TOKENS.check(self.batch * seq, "", detail=f"`batch` {self.batch} x `seq` {seq} = "
                                f"{self.batch * seq:,} tokens per step")
        self._check_scale()
        if self.pipelined:
            check_batch(self.batch, self.microbatches, self.dp, self.fsdp, self.ep)
        self._check_resilience()
        check_positive_number("`lr`", self.lr)
        if self.clip is not None:
            check_positive_number("`clip`", self.clip)
        check_timeout(self.timeout)
        bad = [c for c in self.collect if c not in COLLECT]
        if bad:
            raise RunError(f"collect {bad[0]!r} is not one of {', '.join(COLLECT)}")
        if self.model is not None and hasattr(self.model, "check"):
            self.model.check()
        if self.model is not None and hasattr(self.model, "check_sizes"):  # one micro-batch's activations
            self.model.check_sizes(max(1, self.batch // (self.microbatches * self.shards) if self.pipelined
                                       else self.batch))
        if self.model is not None:
            self.layer_split()

    def _check_slices(self) -> None:
        """`slices`: a whole number that divides the model's sequence, without `recompute`, `offload` or
        packed documents."""
        check_count("`slices`", self.slices, 1, limits.MICROBATCHES)
        if self.slices == 1:
            return
        seq = getattr(self.model, "seq", None)
        if isinstance(seq, int) and seq % self.slices:
            raise RunError(f"`slices` {self.slices}: the model's `seq` {seq} must be a multiple of it (each slice "
                           "takes seq / slices tokens)")
        if self.recompute:
            raise RunError(f"`slices` {self.slices} with `recompute`: a replayed slice would attend to keys and "
                           "values kept without their graph; leave one out")
        if self.offload:
            raise RunError(f"`slices` {self.slices} with `offload`: a slice's saved keys and values are read by the "
                           "later slices' backwards, so they cannot leave the device after its forward; leave one out")
        if getattr(self.model, "pack", False):
            raise RunError(f"`slices` {self.slices} with packed documents (`pack`): a slice would cut documents whose "
                           "masks span it; leave one out")

    def _check_scale(self) -> None:
        """`dp`, `fsdp`, `tp`, `zero`, `ep` and `recompute` (runtime at scale)."""
        try:  # every composition rule, written once
            self.parallelism.check()
        except ParallelismError as e:
            raise RunError(str(e)) from None
        experts = getattr(self.model, "moe_experts", None)
        if self.ep > 1 and isinstance(experts, int):
            if experts < 1:
                raise RunError(f"`ep` {self.ep} shards the experts of MoE blocks; the model has none: give "
                               "`moe_experts`")
            if experts % self.ep:
                raise RunError(f"`ep` {self.ep} must divide `moe_experts` {experts}: each rank of the "
                               "expert-parallel group holds as many experts")
        if self.ep > 1 and (self.save or self.resume):
            raise RunError(f"{'`save`' if self.save else '`resume`'} with `ep` {self.ep}: an expert-parallel rank "
                           "holds its own experts under names the other ranks also use; run with `ep` 1 to save "
                           "or resume")
        why = self.parallelism.unsupported()
        if why:
            raise RunError(why)
        if self.recompute_at not in RECOMPUTE_AT:
            raise RunError(f"`recompute_at` {self.recompute_at!r}: one of {', '.join(RECOMPUTE_AT)}")
        if self.recompute_at != "backward" and not self.recompute:
            raise RunError(f"`recompute_at` {self.recompute_at} places the recomputes of `recompute`; give "
                           "`recompute` too")
        if not self.pipelined and (self.dp > 1 or self.ep > 1 or self.recompute or self.offload):
            what = f"`dp` {self.dp}" if self.dp > 1 else f"`ep` {self.ep}" if self.ep > 1 else \
                "`recompute`" if self.recompute else "`offload`"
            raise RunError(f"{what} needs a `schedule` run on ranks (`ranks` or `dp` >= 2); the unpipelined "
                           "reference runs in one process")
        if self.schedule is None and self.csv is None and (self.fsdp > 1 or self.tp > 1):
            what = f"`fsdp` {self.fsdp}" if self.fsdp > 1 else f"`tp` {self.tp}"
            raise RunError(f"{what} needs a `schedule` run on ranks; the unpipelined reference runs in one process")
        if self.tp > 1 and self.model is not None and hasattr(self.model, "layers"):
            self._check_tp()

    def _check_tp(self) -> None:
        """`tp` divides what the model's tensor-parallel plan splits (its heads), before any rank starts."""
        check_divides(self.tp, getattr(self.model.layers(), "tp_divides", ()))

    def _check_resilience(self) -> None:
        """`save`, `save_every`, `resume` (checkpoint_files.py; the test fault: worker.preflight). The
        unpipelined reference resumes and saves checkpoints of any layout; restarts and stop notices are the
        ranks'."""
        if self.save_every is not None:
            check_count("`save_every`", self.save_every, 1)
        ranks_only = [name for name, given in (("`save_on_signal`", self.save_on_signal is not None),
                                               ("`max_restarts`", bool(self.max_restarts)),
                                               ("`elastic`", self.elastic is not None),
                                               ("`grow_after`", self.grow_after is not None)) if given]
        if not self.pipelined and ranks_only:
            raise RunError(f"{ranks_only[0]} needs a `schedule` run on ranks; the unpipelined reference runs in one "
                           "process")
        self._check_restarts()

    def _check_restarts(self) -> None:
        """`save_on_signal`, `max_restarts`, `elastic` (run/restart.py, resilience/preempt.py)."""
        if self.save_on_signal is not None:
            check_positive_number("`save_on_signal`", self.save_on_signal)
            if not self.save:
                raise RunError("`save_on_signal` writes a checkpoint when a stop notice comes: it needs `save`")
        check_count("`max_restarts`", self.max_restarts, 0)
        if self.grow_after is not None:
            check_count("`grow_after`", self.grow_after, 1)
            if not self.save:
                raise RunError("`grow_after` stops the ranks at a checkpoint to grow back: it needs `save`")
        if self.elastic is None:
            return
        try:
            low, high = self.elastic
        except (TypeError, ValueError):
            raise RunError(f"`elastic` must be MIN:MAX ranks; got {self.elastic!r}") from None
        check_count("`elastic` MIN", low, 1)
        check_count("`elastic` MAX", high, low)
        if not low <= self.world <= high:
            raise RunError(f"`elastic` {low}:{high}: the run starts on {self.world} ranks, outside MIN:MAX; give a "
                           f"range that holds {self.world}")
        # a worker of torchrun's elastic agent: torchrun restarts it (its own --max-restarts)
        if self.max_restarts < 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") is None:
            raise RunError(f"`elastic` {low}:{high} re-plans the layout when a restart finds fewer ranks: give "
                           "`max_restarts` >= 1")

_DEGREES = {"ranks": "pp", **{f.name: f.name for f in fields(Parallelism) if f.name != "pp"}}
_fields_init = RunConfig.__init__


def _init(self, *, parallelism: Parallelism | None = None, **kw) -> None:
    """RunConfig's constructor: ``ranks`` (pp), ``dp``, ``fsdp``, ``tp``, ``ep``, ``etp``, ``zero`` and
    ``reshard_after_forward`` as keywords change those degrees of ``parallelism`` (so ``dataclasses.replace(cfg,
    dp=2)`` reads as it did); the value kept is one ``Parallelism``."""
    degrees = {_DEGREES[k]: kw.pop(k) for k in list(kw) if k in _DEGREES}
    par = parallelism if parallelism is not None else Parallelism(pp=4)
    if degrees:
        if not isinstance(par, Parallelism):
            raise RunError(f"`parallelism` must be a stagewise.Parallelism; got {type(par).__name__}")
        par = replace(par, **degrees)
    _fields_init(self, parallelism=par, **kw)


def _signature():
    import inspect

    fields_ = [p.replace(default=None) if p.name == "parallelism" else p
               for p in inspect.signature(_fields_init).parameters.values()]
    degrees = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in _DEGREES]
    return inspect.Signature(fields_[:1] + degrees + fields_[1:])


_init.__signature__ = _signature()
RunConfig.__init__ = _init
