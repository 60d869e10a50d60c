"""How ranks are arranged: the one value of a parallel layout (pp, dp, fsdp, tp, ep, zero, ...).

A ``Parallelism`` is what the planner recommends, what a run is configured with (``RunConfig.parallelism``),
what a run reports, what the runtime's ``Grid`` makes its process groups from, and what every printed command
(stagewise, torchtitan, Megatron-LM, DeepSpeed) is rendered from. It knows its world size and its data shards,
builds itself from a world size and some degrees, from a mesh's dimension names and shape, or from the
planner's words, and holds every composition rule in ``check()`` (what divides what) and ``unsupported()``
(what stagewise's runtime does not compose yet), each with one message. No torch here: it is checked before
any rank starts.

The degrees, outermost first in a mesh made from them (torchtitan's ``ParallelDims`` order: replicas outside,
tensor parallel innermost so it stays inside a node)::

    dp    pipeline replicas whose gradients are all-reduced (with zero=1: ZeRO-1 over them)
    fsdp  sharded data parallel (FSDP2 per stage); with dp > 1 it is HSDP (replicate over dp, shard over fsdp)
    ep    expert parallel: ep ranks take different rows and share each MoE block's experts
    pp    pipeline stages
    tp    tensor parallel inside each stage

``dp``, ``fsdp`` and ``ep`` split a step's batch (``data_shards``); tp ranks take the same rows.

Example:
    >>> par = Parallelism.of_world(8, dp=2, tp=2)      # pp = 8 / (2 x 2) = 2
    >>> par.pp, par.world, par.data_shards, par.describe()
    (2, 8, 2, 'pp 2 x dp 2 x tp 2')
    >>> Parallelism.of_mesh(("dp", "pp"), (2, 4)) == Parallelism(pp=4, dp=2)
    True
    >>> Parallelism.of_plan(p=4, dp=8, t=2, sharding="hsdp", shard=4).describe()
    'pp 4 x dp 2 x fsdp 4 x tp 2'
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from collections.abc import Mapping, Sequence

from .errors import StagewiseError


class ParallelismError(StagewiseError):
    """A parallel layout that does not hold together (the message names the degree and the rule)."""


#: the mesh dimensions, outermost first in a mesh made from degrees
DIMS = ("dp", "fsdp", "ep", "pp", "tp")
#: the dimensions whose ranks take different rows of a step's batch (tp ranks take the same rows)
DATA_DIMS = ("dp", "fsdp", "ep")
#: the data-parallel shardings a plan names (``sharding``; ``of_plan`` maps each onto dp x fsdp x zero): replicated
#: (gradients all-reduced), ZeRO-1 (optimizer state sharded), FSDP (ZeRO-3: weights, gradients and optimizer
#: state sharded over the data-parallel ranks), HSDP (sharded over a shard group, replicated across groups)
SHARDINGS = ("ddp", "zero1", "fsdp", "hsdp")


def _degree(help_: str, flag: str, *short: str) -> field:
    return field(default=1, metadata={"help": help_, "flag": flag, "short": short})


@dataclass(frozen=True, kw_only=True)
class Parallelism:
    """One parallel layout. Immutable; ``check()`` says whether it holds together.

    Build it with the degrees (``Parallelism(pp=2, dp=2)``), from a world size (``of_world``), from a
    mesh's names and shape (``of_mesh``) or from the planner's words (``of_plan``).
    """

    pp: int = _degree("ranks of one pipeline (the pipeline-parallel degree)", "--ranks", "-p")
    dp: int = _degree("pipeline replicas (data parallel), each on its share of the batch, gradients all-reduced "
                      "per stage over them", "--dp")
    fsdp: int = _degree("sharded data parallel: torch's FSDP2 on each stage, gathered one stage ahead of its first "
                        "forward and reduce-scattered after its last backward (with --dp: HSDP)", "--fsdp")
    tp: int = _degree("tensor parallel inside each stage: the model's plan (the built-in GPT's, or an --hf model's "
                      "base_model_tp_plan)", "--tp")
    ep: int = _degree("expert parallel: ranks that take different rows and share each MoE block's experts, each "
                      "holding 1/ep of them", "--ep")
    #: expert tensor parallel: how many tp ranks split each expert (None: tp, the experts split as attention
    #: is; 1: each expert whole on a tp rank, Megatron-Core's MoE parallel folding)
    etp: int | None = field(default=None, metadata={"help": "expert tensor parallel (default: tp)",
                                                    "flag": "--etp"})
    zero: int = field(default=0, metadata={
        "help": "1: ZeRO-1, the optimizer state sharded over the --dp replicas (torch's ZeroRedundancyOptimizer; "
                "gradients all-reduced)", "flag": "--zero"})
    reshard_after_forward: bool = field(default=False, metadata={
        "help": "with --fsdp: free each layer's gathered weights after its forward and its backward (an all-gather "
                "per layer per pass) instead of keeping the stage gathered until its last backward",
        "flag": "--reshard-after-forward"})

    # ---- sizes

    @property
    def world(self) -> int:
        """Ranks in all: pp x dp x fsdp x ep x tp."""
        return self.pp * self.dp * self.fsdp * self.ep * self.tp

    @property
    def data_shards(self) -> int:
        """The shares a step's batch is cut into across ranks: dp x fsdp x ep (tp ranks take the same rows)."""
        return self.dp * self.fsdp * self.ep

    @property
    def per_pipeline_rank(self) -> int:
        """Ranks at one pipeline position: world / pp (dp x fsdp x ep x tp)."""
        return self.dp * self.fsdp * self.ep * self.tp

    @property
    def expert_tp(self) -> int:
        """The expert tensor-parallel degree (``etp``, or ``tp`` when not given)."""
        return self.tp if self.etp is None else self.etp

    @property
    def expert_degree(self) -> int:
        """GPUs a block's routed experts are spread over (Megatron-LM's ``--expert-model-parallel-size``): the
        ``ep x tp`` ranks that share the experts, each expert cut over ``expert_tp`` of them (MoE parallel
        folding: ``ep`` 4, ``tp`` 2, ``etp`` 1 spreads the experts over 8 GPUs).

        >>> Parallelism(pp=2, ep=4, tp=2, etp=1).expert_degree
        8
        """
        return max(1, self.ep * self.tp // self.expert_tp)

    def size(self, dim: str) -> int:
        """The degree of one mesh dimension (``"pp"``, ``"dp"``, ...)."""
        if dim not in DIMS:
            raise ParallelismError(f"`dim` {dim!r} is not one of {', '.join(DIMS)}")
        return getattr(self, dim)

    def degrees(self) -> dict[str, int]:
        """Every mesh dimension's degree, in ``DIMS`` order (the outermost first)."""
        return {d: getattr(self, d) for d in DIMS}

    def dims(self, keep_pp: bool = True) -> tuple[str, ...]:
        """The dimensions of size > 1 in mesh order (``pp`` always, unless ``keep_pp`` is False)."""
        return tuple(d for d in DIMS if getattr(self, d) > 1 or (keep_pp and d == "pp"))

    def describe(self) -> str:
        """``pp 2 x dp 2 x tp 2`` (pp first, then each other dimension of size > 1 in mesh order), with the
        options after it (``, zero 1``, ``, reshard after forward``, ``, etp 1``)."""
        parts = [f"pp {self.pp}"] + [f"{d} {getattr(self, d)}" for d in DIMS if d != "pp" and getattr(self, d) > 1]
        extra = ([f"etp {self.etp}"] if self.etp is not None and self.etp != self.tp else []) \
            + (["zero 1"] if self.zero else []) + (["reshard after forward"] if self.reshard_after_forward else [])
        return " x ".join(parts) + "".join(f", {e}" for e in extra)

    def __str__(self) -> str:
        return self.describe()

    # ---- builders

    @classmethod
    def of_world(cls, world: int, *, pp: int | None = None, **degrees) -> "Parallelism":
        """The layout of ``world`` ranks with these degrees; ``pp`` is the rest when not given (the one place
        a world size is divided into degrees). Raises ``ParallelismError`` when they do not multiply up."""
        _whole("world", world)
        given = cls(**{"pp": pp or 1, **degrees})
        given.check()
        other = given.per_pipeline_rank
        if pp is None:
            if world % other:
                raise ParallelismError(
                    f"{_product(given, exclude=('pp',))} = {other} does not divide the {world} ranks: launch a "
                    f"multiple of {other} ranks, or give degrees whose product divides {world}")
            return replace(given, pp=world // other)
        if given.world != world:
            raise ParallelismError(f"{_product(given)} = {given.world} ranks, but the world has {world}: the "
                                   "degrees must multiply to the world size")
        return given

    @classmethod
    def of_mesh(cls, names: Sequence[str], shape: Sequence[int], **options) -> "Parallelism":
        """The layout of a mesh with these dimension names (any order, from ``DIMS``) and sizes; a dimension
        left out has size 1. ``options``: ``zero``, ``etp``, ``reshard_after_forward``."""
        names, shape = tuple(names), tuple(shape)
        if not names:
            raise ParallelismError(f"mesh {shape}: its dimensions need names, from {', '.join(DIMS)} (e.g. "
                                   "init_device_mesh(device, (2, 2), mesh_dim_names=('dp', 'pp')))")
        if len(names) != len(shape):
            raise ParallelismError(f"mesh names {names} and shape {shape} differ in length")
        unknown = [n for n in names if n not in DIMS]
        if unknown:
            raise ParallelismError(f"mesh dimension {unknown[0]!r} (of {names}) is not one of {', '.join(DIMS)}")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ParallelismError(f"mesh {names} names the dimension {twice[0]!r} twice")
        if "pp" not in names:
            raise ParallelismError(f"mesh {names} has no 'pp' dimension: name the pipeline's dimension 'pp' "
                                   f"(the others from {', '.join(d for d in DIMS if d != 'pp')})")
        par = cls(**dict(zip(names, (int(n) for n in shape))), **options)
        par.check()
        return par

    @classmethod
    def of_plan(cls, *, p: int, dp: int, t: int = 1, sharding: str = "ddp", shard: int | None = None,
                ep: int = 1, etp: int | None = None, reshard_after_forward: bool = False) -> "Parallelism":
        """The layout of a planner candidate, in the planner's words: ``dp`` data-parallel ranks per pipeline
        rank and tensor-parallel group, sharded as ``sharding`` (``SHARDINGS``; ``shard``: HSDP's shard group),
        the routed experts spread over ``ep`` GPUs of a stage (Megatron-LM's expert parallel), each expert cut
        over ``etp`` of them (None: t). With etp = t the ep GPUs are ep data ranks; folded (etp < t) they are
        ``ep x etp / t`` data ranks with their tensor-parallel groups (``expert_degree`` gives ep back)."""
        if sharding not in SHARDINGS:
            raise ParallelismError(f"`sharding` {sharding!r} is not one of {', '.join(SHARDINGS)}")
        _whole("ep", ep)
        x = t if etp is None else etp
        _whole("etp", x)
        if (ep * x) % t:
            raise ParallelismError(f"`ep` {ep} x `etp` {x} is not a multiple of `t` {t}: the expert layout must "
                                   "cover whole tensor-parallel groups")
        ranks = ep * x // t  # the data ranks that share the experts
        if dp % ranks:
            raise ParallelismError(f"`ep` {ep} does not divide `dp` {dp}: expert parallel takes ep of a stage's "
                                   "data-parallel ranks" if x == t else
                                   f"`ep` {ep} x `etp` {x} / `t` {t} = {ranks} does not divide `dp` {dp}: the "
                                   "experts are spread over whole data-parallel ranks")
        ep = ranks
        rest = dp // ep
        if sharding == "hsdp":
            if not shard or rest % shard:
                raise ParallelismError(f"`shard` {shard} must divide the {rest} data-parallel ranks for HSDP")
            replicas, shards = rest // shard, shard
        elif sharding == "fsdp":
            replicas, shards = 1, rest
        else:
            replicas, shards = rest, 1
        par = cls(pp=p, dp=replicas, fsdp=shards, tp=t, ep=ep, etp=None if etp == t else etp,  # = t: the default
                  zero=1 if sharding == "zero1" and replicas > 1 else 0,
                  reshard_after_forward=reshard_after_forward and shards > 1)
        par.check()
        return par

    @property
    def sharding(self) -> str:
        """The planner's word for the data-parallel part: ddp, zero1, fsdp or hsdp."""
        if self.fsdp > 1:
            return "hsdp" if self.dp > 1 else "fsdp"
        return "zero1" if self.zero else "ddp"

    # ---- rules

    def check(self) -> None:
        """Every rule a layout must keep, whoever runs it (raises ``ParallelismError`` naming the degree)."""
        for f in fields(self):
            if f.name in DIMS:
                _whole(f.name, getattr(self, f.name))
        if self.etp is not None:
            _whole("etp", self.etp)
            if self.tp % self.etp and self.etp % self.tp:
                raise ParallelismError(f"`etp` {self.etp} and `tp` {self.tp}: one must divide the other (experts "
                                       "are split over a part of the tensor-parallel group, or over more ranks)")
        if self.zero not in (0, 1) or isinstance(self.zero, bool):
            raise ParallelismError(f"`zero` must be 0 (off) or 1 (ZeRO-1: optimizer state sharded over `dp`); "
                                   f"got {self.zero!r}")
        if not isinstance(self.reshard_after_forward, bool):
            raise ParallelismError(f"`reshard_after_forward` must be True or False; got "
                                   f"{self.reshard_after_forward!r}")
        if self.zero and self.fsdp > 1:
            raise ParallelismError(f"`zero` 1 with `fsdp` {self.fsdp}: FSDP already shards the optimizer state "
                                   "with the parameters; give one of them (ZeRO-1 shards it over `dp` replicas)")
        if self.zero and self.dp < 2:
            raise ParallelismError("`zero` 1 shards the optimizer state over the `dp` replicas: it needs `dp` >= 2")
        if self.reshard_after_forward and self.fsdp < 2:
            raise ParallelismError("`reshard_after_forward` frees FSDP's gathered layers: it needs `fsdp` >= 2")

    def unsupported(self) -> str | None:
        """Why stagewise's runtime cannot run this layout (None: it can). The one home of what is not composed
        yet, read by ``RunConfig``, the ``Pipeline`` and the planner (which offers no such layout for stagewise)."""
        if self.ep > 1 and (self.fsdp > 1 or self.tp > 1):
            return (f"`ep` {self.ep} with {'`fsdp`' if self.fsdp > 1 else '`tp`'}: expert parallel is not composed "
                    "with FSDP or tensor parallel yet; give `ep` with `dp` only")
        if self.etp is not None and self.etp != self.tp:
            return f"`etp` {self.etp} (experts split unlike attention's `tp` {self.tp}) is not run by stagewise yet"
        return None

    def unsupported_by_hf(self) -> str | None:
        """Why ``stagewise train --hf`` cannot run this layout beyond ``unsupported()`` (None: it can): what a
        Hugging Face model brings itself. Read by the train CLI and the planner's stagewise rows. Today none:
        a Hugging Face mixture of experts' stacked experts shard over ``ep`` as stagewise's own do."""
        return None

    def check_runs(self) -> None:
        """``check()``, then what stagewise's runtime composes (raises ``ParallelismError``)."""
        self.check()
        why = self.unsupported()
        if why:
            raise ParallelismError(why)

    # ---- words

    def flags(self) -> list[str]:
        """The layout as ``stagewise train`` options (``["-p", "2", "--dp", "2"]``): each degree > 1 and each
        option that is set; nothing the defaults already say."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "pp" and (value == f.default or (f.name == "etp" and value == self.tp)):
                continue
            flag = (*f.metadata.get("short", ()), f.metadata["flag"])[0]  # -p for pp
            out += [flag] if isinstance(value, bool) else [flag, str(value)]
        return out

    def to_dict(self) -> dict:
        """The degrees and options, with ``world`` and ``data_shards`` (the run's and plan's JSON)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "world": self.world,
                "data_shards": self.data_shards}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Parallelism":
        """Reverse of ``to_dict`` (``world`` and ``data_shards`` checked when present)."""
        names = {f.name for f in fields(cls)}
        par = cls(**{k: v for k, v in d.items() if k in names})
        par.check()
        for k in ("world", "data_shards"):
            if k in d and d[k] != getattr(par, k):
                raise ParallelismError(f"`{k}` {d[k]} does not match the degrees ({par.describe()}: "
                                       f"{getattr(par, k)})")
        return par


def _whole(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ParallelismError(f"`{name}` must be a whole number >= 1; got {value!r}")


def _product(par: Parallelism, exclude: tuple[str, ...] = ()) -> str:
    sizes = [(d, getattr(par, d)) for d in ("pp", "dp", "fsdp", "ep", "tp") if d not in exclude]
    shown = [f"`{d}` {n}" for d, n in sizes if n > 1] or [f"`{sizes[0][0]}` 1"]
    return " x ".join(shown)


__all__ = ["DATA_DIMS", "DIMS", "Parallelism", "ParallelismError", "SHARDINGS"]
