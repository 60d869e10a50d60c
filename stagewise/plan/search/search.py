"""The configuration search: every p x dp, family, v, micro-batch size, recomputation and split.

Each configuration is simulated with the same schedule programs and simulator
everything else uses; nothing here knows a family by name. Schedules, their
``Holding`` and the exact partitions are cached: a partition depends only on
the holding, the micro-batch size and recomputation, so 1F1B at m = 8, 16, 32
shares one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import sub
from typing import Callable, Iterable

from ...parallelism import Parallelism
from ...schedule import Schedule
from ...schedules import FAMILIES, generate, whole_names
from ... import limits
from ...schedules.registry import ScheduleArgError, check_args
from ...simulate import simulate
from ...timeline import Timeline
from .bands import LOCAL_MEMORY_BAND, profile_band
from .devices import Cluster
from ..errors import PlanError
from .holding import Holding, holding
from .lowered import local_data_parallel
from ...split import Split, format_layout
from .profile_costs import (layer_costs, rank_fixed_bytes, rank_optimizer_time, rank_transient_bytes, stage_costs,
                    stage_param_bytes, step_sync_time)
from .overhead import step_overhead
from .partition import SPLITS, Partition, best_split, evaluate, even_split
from .profile import Profile


@dataclass(frozen=True, kw_only=True)
class Config:
    """One point of the search space."""

    family: str
    p: int  #: pipeline ranks
    dp: int  #: data-parallel replicas
    v: int  #: stages per rank
    m: int  #: micro-batches per step (per replica)
    mbs: int  #: micro-batch size (samples)
    recompute: bool

    @property
    def parallelism(self) -> Parallelism:
        """The layout as the one value runs are built from: p pipeline ranks x dp replicas (the local planner's
        data parallelism is replicated; a cluster candidate holds its own, with t, the sharding and the experts)."""
        return Parallelism(pp=self.p, dp=self.dp)

    def label(self) -> str:
        rc = " rc" if self.recompute else ""
        return f"{self.family} p={self.p} dp={self.dp} v={self.v} m={self.m} mbs={self.mbs}{rc}"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A simulated configuration: its split and what it costs."""

    config: Config
    counts: tuple[int, ...]  #: layers per piece (model order)
    layout: str
    step_time: float  #: seconds: pipeline makespan + step-end collectives + optimizer step + overhead
    makespan: float
    allreduce: float  #: step-end collectives: data-parallel gradients, tied weights, the loss
    optimizer: float
    throughput: float  #: samples per second (whole cluster)
    bubble: float
    memory: tuple[float, ...]  #: peak bytes per rank
    activations: tuple[float, ...]  #: of which activations (the simulated peak per rank)
    fits: bool
    schedule: Schedule = field(compare=False, repr=False)
    overhead: float = 0.0  #: beyond the layers' profile: their slowdown in a run x makespan + per-step work (measured)
    band: float | None = None  #: relative half-width of the step's error band (the profile's measured spread)
    #: relative half-width of the memory's band (measured runs: ``bands.LOCAL_MEMORY_BAND``)
    memory_band: float | None = None

    @property
    def parallelism(self) -> Parallelism:
        """The configuration's layout (``Config.parallelism``)."""
        return self.config.parallelism

    @property
    def split(self) -> Split:
        """``counts`` as the value the runtime takes (``RunConfig(split=...)``, ``Pipeline(split=...)``)."""
        return Split(self.counts)

    def to_dict(self) -> dict:
        c = self.config
        return {"family": c.family, "p": c.p, "dp": c.dp, "v": c.v, "m": c.m, "micro_batch_size": c.mbs,
                "recompute": c.recompute, "layout": self.layout, "counts": list(self.counts),
                "step_time": self.step_time, "makespan": self.makespan, "allreduce": self.allreduce,
                "optimizer": self.optimizer, "overhead": self.overhead,
                "throughput": self.throughput, "bubble": self.bubble, "peak_memory": list(self.memory),
                "fits": self.fits, "band": self.band, "memory_band": self.memory_band,
                "step_time_band": None if self.band is None else [self.step_time * (1 - self.band),
                                                                  self.step_time * (1 + self.band)]}


@dataclass(frozen=True, kw_only=True)
class Space:
    """What to enumerate; None = everything that applies."""

    families: tuple[str, ...] | None = None
    #: v tried for families that take any v; None: every v >= 2 that fits the layers (p x v <= layers)
    chunks: tuple[int, ...] | None = (2, 4)
    micro_batch_sizes: tuple[int, ...] | None = None
    recompute: tuple[bool, ...] = (False, True)
    counts: tuple[int, ...] | None = None  #: a fixed split (from --layout) instead of the partitioner
    #: of ``partition.SPLITS``: "even" splits the blocks equally (``even_split``) and skips the v and p that do
    #: not divide them, as a framework runs with no layout flags; "balanced" lets the partitioner choose
    split: str = "balanced"

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise PlanError(f"split {self.split!r}: choose one of {', '.join(SPLITS)}")


@dataclass(kw_only=True)
class Searcher:
    """Enumerates and simulates configurations; mutable only for its caches."""

    profile: Profile
    cluster: Cluster
    global_batch: int
    space: Space = field(default_factory=Space)
    _schedules: dict = field(default_factory=dict)
    _partitions: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)  #: reason -> count

    def configs(self, build: bool = True) -> list[Config]:
        """Every configuration to simulate (family argument rules already applied). ``build`` False checks
        the families' rules without generating a schedule (the cluster search builds them lazily)."""
        L = len(self.profile.layers)
        sizes = self.space.micro_batch_sizes or self.profile.micro_batch_sizes
        out = []
        for p, dp in self.cluster.layouts():
            for mbs in sizes:
                if self.global_batch % (dp * mbs):
                    continue
                m = self.global_batch // (dp * mbs)
                for fam, v in self._families(p, m, L, build):
                    out += [Config(family=fam, p=p, dp=dp, v=v, m=m, mbs=mbs, recompute=rc)
                            for rc in self.space.recompute]
        return out

    def _families(self, p: int, m: int, layers: int, build: bool = True) -> Iterable[tuple[str, int]]:
        for name in self.space.families or whole_names():
            if p == 1 and name != "1f1b" and not self._named_families():
                continue  # on one stage every family is gradient accumulation, which 1f1b's program is
            fam = FAMILIES[name]
            for v in fam.chunks or self.space.chunks or range(2, layers // p + 1):
                if p * v > layers or (p == 1 and v > 1):  # v chunks on one rank are gradient accumulation
                    continue
                if self.space.split == "even" and self._even(p * v // fam.param_copies) is None:
                    why = "--split even: p x v does not divide the blocks"
                    self.skipped[why] = self.skipped.get(why, 0) + 1
                    continue
                if not build:
                    if self._accepts(name, p, m, v):
                        yield name, v
                    continue
                if self._schedule(name, p, m, v) is None:
                    continue
                pieces = self._schedules[(name, p, m, v)][1].pieces
                if self.space.counts is not None and pieces != len(self.space.counts):
                    self.skipped["--layout has a different number of stages"] = 1
                    continue
                yield name, v

    def _named_families(self) -> bool:
        """Whether the families were asked for by name (then each is planned at p = 1 too)."""
        return bool(self.space.families)

    def _even(self, stages: int) -> tuple[int, ...] | None:
        """``even_split`` of this profile's layers over ``stages``."""
        return even_split(self.profile.symbols, stages)

    def _accepts(self, name: str, p: int, m: int, v: int) -> bool:
        """Whether ``generate`` would take these arguments (its rules and size limits), without generating."""
        fam = FAMILIES[name]
        try:
            check_args(fam, p, m, v)
            limits.check_schedule_size(p, m, v, 3 if fam.split_backward else 2, name=name)
        except (ScheduleArgError, limits.LimitError) as e:
            self.skipped[str(e)] = self.skipped.get(str(e), 0) + 1
            return False
        return True

    def _schedule(self, name: str, p: int, m: int, v: int) -> Schedule | None:
        key = (name, p, m, v)
        if key not in self._schedules:
            try:
                sched = generate(name, p, m, v)
                self._schedules[key] = (sched, holding(sched))
            except (ScheduleArgError, limits.LimitError) as e:  # a rule of the family, or m over the limit
                self._schedules[key] = None
                self.skipped[str(e)] = self.skipped.get(str(e), 0) + 1
            except ModuleNotFoundError:  # a family whose generator is not in this install
                self._schedules[key] = None
                self.skipped[f"{name}: generator not installed"] = 1
        got = self._schedules[key]
        return got[0] if got else None

    def evaluate(self, c: Config) -> Candidate:
        sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
        part = self._partition(h, c)
        prof, cl = self.profile, self.cluster
        costs = stage_costs(prof, part.counts, h, c.mbs, c.recompute, cl, c.p, c.dp)
        makespan, bubble = timing(simulate(sched, costs, check=False))
        acts = peak_activation_bytes(h, costs.resolve(sched.stages).activation_bytes)
        fixed = rank_fixed_bytes(prof, part.counts, h, cl.state_factor)
        transient = rank_transient_bytes(prof, part.counts, h, c.mbs, c.recompute)
        memory = tuple(f + a + t for f, a, t in zip(fixed, acts, transient))
        exposed = local_data_parallel(sched, costs, stage_param_bytes(prof, part.counts, h), c.parallelism, cl,
                                      makespan)
        allreduce = exposed + step_sync_time(prof, part.counts, h, cl, c.p, c.dp)
        opt = max(rank_optimizer_time(prof, part.counts, h))
        over = step_overhead(prof, max(len(p) for p in sched.programs), makespan)
        step = makespan + allreduce + opt + over
        return Candidate(config=c, counts=part.counts, layout=format_layout(prof.symbols, part.counts),
                         step_time=step, makespan=makespan, allreduce=allreduce, optimizer=opt,
                         throughput=self.global_batch / step if step > 0 else float("inf"),
                         bubble=bubble, memory=memory, activations=acts, overhead=over,
                         fits=cl.memory is None or max(memory) <= cl.memory * (1 + 1e-9), schedule=sched,
                         band=profile_band(prof, c.mbs), memory_band=LOCAL_MEMORY_BAND)

    def _partition(self, h: Holding, c: Config) -> Partition:
        """The exact split; the memory-free one is shared by every m and reused when it fits."""
        lc = layer_costs(self.profile, c.mbs, c.recompute, self.cluster.state_factor, self.cluster)
        limit = self.cluster.memory
        if self.space.counts is not None or self.space.split == "even":
            return evaluate(lc, h, self.space.counts or self._even(h.pieces), limit)
        free_key = (h.stage_piece, h.stage_rank, h.stage_share, c.mbs, c.recompute)
        if free_key not in self._partitions:
            self._partitions[free_key] = best_split(lc, h, None)
        part = evaluate(lc, h, self._partitions[free_key], limit)
        if part.fits:
            return part
        key = (h, c.mbs, c.recompute)
        if key not in self._partitions:
            self._partitions[key] = best_split(lc, h, limit)  # None: nothing fits
        counts = self._partitions[key]
        return part if counts is None else evaluate(lc, h, counts, limit)


def timing(tl: Timeline) -> tuple[float, float]:
    """(makespan, bubble) of a timeline: ``metrics`` without its time-free memory pass."""
    t0 = min(st[0] for st in tl.starts if st)
    t1 = max(en[-1] for en in tl.ends if en)
    # every (end - start) in the same order as a nested generator adds them (so the same float), without
    # a Python frame per action
    busy = sum(chain.from_iterable(map(map, repeat(sub), tl.ends, tl.starts)))
    span = t1 - t0
    return span, (1.0 - busy / (tl.ranks * span) if span > 0 else 0.0)


def peak_activation_bytes(h: Holding, act_bytes) -> tuple[float, ...]:
    """Peak live activation bytes per rank from the schedule's peak live counts (``Holding.live``)."""
    return tuple(max((sum(n * act_bytes[s] for n, s in zip(vec, stages)) for vec in vecs), default=0.0)
                 for vecs, stages in zip(h.live, h.rank_stages))


def search(searcher: Searcher, progress: Callable[[int, int], None] | None = None) -> list[Candidate]:
    """Every configuration simulated, fitting ones first, fastest first."""
    configs = searcher.configs()
    if not configs:
        raise PlanError(_no_config_message(searcher))
    out = []
    for n, c in enumerate(configs, 1):
        out.append(searcher.evaluate(c))
        if progress:
            progress(n, len(configs))
    return rank(out)


def rank(cands: list[Candidate]) -> list[Candidate]:
    return sorted(cands, key=lambda x: (not x.fits, x.step_time, max(x.memory)))


def _no_config_message(s: Searcher) -> str:
    L = len(s.profile.layers)
    sizes = s.space.micro_batch_sizes or s.profile.micro_batch_sizes
    pairs = ", ".join(f"{p}x{dp}" for p, dp in s.cluster.layouts())
    return (f"no configuration: --devices {s.cluster.devices} gives p x dp in {{{pairs}}}, and none of them "
            f"divides --global-batch {s.global_batch} into micro-batches of size {'/'.join(map(str, sizes))} "
            f"with p <= {L} layers; choose a global batch that is a multiple of dp x micro-batch size")
