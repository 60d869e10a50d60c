"""Search at cluster scale: tensor x pipeline x data parallel, family, v, micro-batch size, recomputation, split.

For each tensor-parallel degree t the model gets an analytic profile (one GPU of
a t-group); the rest is the ordinary search: the same schedules, a split of
identical blocks (``block_split``: the first and last stage get fewer blocks
when the embedding, the head or the warm-up activations make them heavier) and
the one simulator. Recomputation (off, selective, full) is the analytic
profile's: full checkpoints each block, as Megatron-LM and torchtitan do, so the
generic ``Config.recompute`` (a whole stage replayed, the runtime's way) stays
off here (stagewise's own runtime replays a whole stage: its "stage" mode is that
generic recomputation). What this module adds is the cluster around the pipeline:
the data-parallel sharding (ddp, ZeRO-1, FSDP, HSDP) and its memory, and the
reduction and weight gathers overlapped as each framework's rules say
(``overlap``, ``data_parallel``); the job and its rules are in ``cluster_job``.

The search is best-first and exact for the top K (and for each framework's best):
every configuration gets a schedule-free lower bound first (its busiest rank's
share of the work at perfect balance, plus the optimizer step), and only those
whose bound can still reach the top have their schedule built and their split,
memory and tighter bound prepared; only prepared ones that fit and can still reach
the top are simulated.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import accumulate
from typing import Callable, NamedTuple

from ..costs import Costs
from ..parallelism import Parallelism
from ..schedules import FAMILIES
from ..schedules.registry import gc_paused
from ..simulate import simulate
from .activations import dropped_modules
from .analytic import TensorParallel, analytic_profile, replay_bytes
from .block_split import block_split, is_block_model
from .cluster import Cluster
from .cluster_job import Job, _nothing_to_search, check_job, shardings, state_factor, tensor_degrees
from .data_parallel import exposed_gather, exposed_reduction, gathered_factor, reduce_scatter_time, reduction_cost
from .errors import PlanError
from ..layout import format_layout
from .model import (blocking_p2p, layer_costs, rank_fixed_bytes, rank_optimizer_time, rank_transient_bytes,
                    stage_costs, step_sync_time)
from .overlap import Framework
from .partition import evaluate as evaluate_split
from .profile import Link
from .search import Candidate, Config, Searcher, peak_activation_bytes, timing
from .steady import extend, short_m

__all__ = ["ClusterCandidate", "ClusterSearcher", "Job", "Result", "check_job", "cluster_search", "searchers",
           "state_factor", "tensor_degrees"]
#: families that run another's stages and work with less memory and more bubble (the controllable-memory
#: building blocks of ZB-V: bubble 0, B/2, 2B/3 of 1F1B's at equal costs); searched only where that family
#: does not fit with its fastest split (tests/test_plan_cluster_search.py checks they are never faster)
TRADES_BUBBLE_FOR_MEMORY = {"v-half": ("zb-v",), "v-min": ("zb-v", "v-half")}
#: recomputation modes by how much they save (the search keeps the least that fits); "stage" is the
#: stagewise runtime's whole-stage replay, which keeps less than block-by-block "full"
_LEVEL = {"off": 0, "selective": 1, "full": 2, "stage": 3}


@dataclass(frozen=True, kw_only=True)
class ClusterCandidate:
    """A simulated configuration with its tensor-parallel degree and cluster figures."""

    t: int
    candidate: Candidate
    exposed_dp: float  #: seconds of gradient reduction not hidden behind the backward
    mfu: float  #: model FLOPs per second / (GPUs x peak)
    tokens_per_second: float
    #: what the blocks recompute: of ``RECOMPUTE`` (the profile's), or "stage" (the runtime's whole stage)
    recompute: str = "off"
    framework: str = "stagewise"  #: whose overlap rules it is costed under (``overlap.FRAMEWORKS``)
    sharding: str = "zero1"  #: of ``overlap.SHARDING``
    shard: int | None = None  #: HSDP: the shard group (dp / shard replicas of it)
    exposed_gather: float = 0.0  #: seconds the step waits for all-gathered weights
    usable: float = float("inf")  #: bytes per GPU the plan may fill (the memory less the reserve)
    band: float | None = None  #: relative half-width of the prediction's error band (None: unknown)
    #: a long step costed from ``mc`` and 2 mc micro-batches (``steady``); ``candidate.schedule`` is the 2 mc one
    costed_from: int | None = None
    ep: int = 1  #: expert-parallel degree (MoE models): routed experts sharded over ep of a stage's dp peers
    ep_nodes: int = 1  #: nodes one expert-parallel group spans (1: its all-to-all stays inside a node)
    etp: int | None = None  #: expert tensor parallel (MoE models; None: t, the experts split as attention)
    #: relative half-width of the memory prediction's band (the hardware file's ``memory_band``; None: unknown)
    memory_band: float | None = None
    fragmentation: float = 0.0  #: bytes the caching allocator holds beside the planned tensors (the reserve's)
    memory_parts: MemoryParts | None = None  #: the fullest GPU's bytes by kind
    expert_placement: str = "within"  #: the device order of an MoE layout (``expert_parallel.PLACEMENTS``)

    @property
    def config(self) -> Config:
        return self.candidate.config

    @property
    def parallelism(self) -> Parallelism:
        """The layout as the one value every printed command and run is built from (the planner's t,
        sharding and shard said by ``Parallelism.of_plan``)."""
        g = self.config
        return Parallelism.of_plan(p=g.p, dp=g.dp, t=self.t, sharding=self.sharding, shard=self.shard, ep=self.ep,
                                   etp=self.etp)

    @property
    def step_time(self) -> float:
        return self.candidate.step_time

    @property
    def fits(self) -> bool:
        return self.candidate.fits

    @property
    def headroom(self) -> float:
        """Bytes left on the fullest GPU under the usable memory."""
        return self.usable - max(self.candidate.memory)

    @property
    def reserved(self) -> float:
        """The allocator's predicted peak on the fullest GPU (what ``torch.cuda.max_memory_reserved`` reads):
        the planned tensors plus the fragmentation the hardware file's reserve sets aside."""
        return max(self.candidate.memory) + self.fragmentation

    @property
    def reserved_band(self) -> tuple[float, float] | None:
        """(least, most) the allocator's peak may be, by the memory band."""
        w = self.memory_band
        return None if w is None else (self.reserved * (1 - w), self.reserved * (1 + w))

    @property
    def step_band(self) -> tuple[float, float] | None:
        """(fastest, slowest) step the band allows."""
        w = self.band
        return None if w is None else (self.step_time * (1 - w), self.step_time * (1 + w))

    @property
    def mfu_band(self) -> tuple[float, float] | None:
        w = self.band
        return None if w is None else (self.mfu / (1 + w), self.mfu / (1 - w) if w < 1 else float("inf"))

    def label(self) -> str:
        dp = f" {self.sharding}" + (f"/{self.shard}" if self.shard else "")
        ep = f" ep={self.ep}" if self.ep > 1 else ""
        if self.etp is not None and self.etp != self.t:
            ep += f" etp={self.etp}"
        return f"t={self.t}{ep} {self.config.label()} recompute={self.recompute}{dp} ({self.framework})"

    def to_dict(self) -> dict:
        band = self.step_band
        return {"t": self.t, "ep": self.ep, "ep_nodes": self.ep_nodes,
                "etp": self.t if self.etp is None else self.etp, "expert_placement": self.expert_placement,
                **self.candidate.to_dict(), "parallelism": self.parallelism.to_dict(),
                "recompute": self.recompute,
                "framework": self.framework, "sharding": self.sharding, "shard": self.shard,
                "exposed_dp": self.exposed_dp, "exposed_gather": self.exposed_gather, "mfu": self.mfu,
                "tokens_per_second": self.tokens_per_second, "usable_memory": self.usable,
                "costed_from_microbatches": self.costed_from,
                "headroom": self.headroom, "band": self.band,
                "peak_memory_reserved": self.reserved, "memory_band": self.memory_band,
                "peak_memory_reserved_band": list(self.reserved_band) if self.reserved_band else None,
                "memory_parts": self.memory_parts.to_dict() if self.memory_parts else None,
                "step_time_band": list(band) if band else None,
                "mfu_band": list(self.mfu_band) if band else None}


@dataclass(frozen=True, kw_only=True)
class _OnePipeline(Cluster):
    """A Cluster searched at one pipeline degree (the t-group is one pipeline rank)."""

    pipeline: int = 1

    def layouts(self) -> list[tuple[int, int]]:
        return [(self.pipeline, self.devices // self.pipeline)]

    def link(self, p: int, dp: int, a: int, b: int) -> Link:
        return self.inter if _crosses(self.per_node, p, dp, a, b) else self.intra


@lru_cache(maxsize=65536)
def _crosses(node: int, p: int, dp: int, a: int, b: int) -> bool:
    """Whether pipeline ranks a and b of some replica sit in different nodes (``Cluster.link``'s rule)."""
    return any((d * p + a) // node != (d * p + b) // node for d in range(dp))


class Prepared(NamedTuple):
    """A configuration costed without simulating: its split, memory and a lower bound on its step."""

    config: Config
    counts: tuple[int, ...]
    memory: tuple[float, ...]
    activations: tuple[float, ...]
    fits: bool
    bound: float  #: fill + the busiest rank's work + drain + the step-end terms: no simulation beats it
    step_end: float  #: tied-weight and loss sums + optimizer step (the frameworks' gathers come on top)
    optimizer: float
    costs: Costs  #: what the simulator plays (asynchronous P2P)
    free: bool = False  #: the split is the fastest one, memory aside (no memory constraint bent it)
    #: the fullest GPU's bytes by kind: ``MemoryParts`` (the gathered weights are the term the lowered
    #: program's UNSHARD/RESHARD points will bound)
    parts: "MemoryParts | None" = None


class MemoryParts(NamedTuple):
    """What the fullest GPU holds at its peak, by kind (bytes)."""

    state: float  #: weights, gradients and optimizer state kept all step (sharded ones: this GPU's share)
    gathered: float  #: a sharded stage's bf16 weights and fp32 gradients while it is gathered (FSDP, HSDP)
    activations: float  #: the schedule's peak of in-flight micro-batches
    transient: float  #: a recomputed micro-batch's rebuilt activations, the block being replayed

    def to_dict(self) -> dict:
        return self._asdict()


@dataclass(kw_only=True)
class ClusterSearcher(Searcher):
    """A Searcher for one (t, p), recomputation and sharding: analytic profile, sharded memory, and the
    frameworks' overlap rules applied to each simulated timeline."""

    job: Job
    t: int
    recompute: str = "off"  #: of ``RECOMPUTE``, or "stage" (the generic whole-stage replay, config.recompute)
    ep: int = 1  #: expert-parallel degree (``expert_parallel.MoESearcher``)
    replay: dict = field(default_factory=dict)  #: mbs -> bytes of the one block replayed (full recomputation)
    sharding: str = "zero1"  #: of ``overlap.SHARDING``
    shard: int | None = None  #: HSDP's shard group
    frameworks: tuple[Framework, ...] = ()  #: those that run this sharding and recomputation
    _timelines: dict = field(default_factory=dict)  #: (config, blocking P2P) -> (timeline, makespan, bubble)

    def _schedule(self, name: str, p: int, m: int, v: int):
        """The family's schedule; for a long step (``steady.short_m``) the ``2 mc`` one stands in for it (same
        stages and peak activations), with the ``mc`` one kept to extend its timing to ``m``."""
        key = (name, p, m, v)
        mc = short_m(name, p, m, v) if name in FAMILIES else None
        if key in self._schedules or mc is None:
            return super()._schedule(name, p, m, v)
        a, b = super()._schedule(name, p, mc, v), super()._schedule(name, p, 2 * mc, v)
        ha, hb = self._schedules.get((name, p, mc, v)), self._schedules.get((name, p, 2 * mc, v))
        if a is None or b is None or ha[1].live != hb[1].live:  # it holds more with every micro-batch
            return super()._schedule(name, p, m, v)
        self._schedules[key] = hb
        self._schedules[("short",) + key] = (mc, a)
        return b

    def long_step(self, c: Config) -> tuple[int, object] | None:
        """(mc, the mc schedule) when ``c``'s step is costed from shorter ones, else None."""
        return self._schedules.get(("short", c.family, c.p, c.m, c.v))

    def floor(self, c: Config) -> float:
        """A lower bound on ``c``'s step without building its schedule: the ranks do at least the average
        share of the work (every layer's F and B per micro-batch, F again when recomputed) plus the average
        of their fill and drain (``fill_floor``), and the optimizer step runs on at least the average share of
        the weights."""
        k = self.profile.size_index(c.mbs)
        layers = self.profile.layers
        work = sum(x.t_f[k] * (2 if c.recompute else 1) + x.t_b[k] for x in layers)
        opt = sum(x.t_opt for x in layers) / c.p / self._opt_share(c.dp)
        hw = self.job.hardware
        return (c.m * work / c.p + fill_floor(c.family, c.p, layers, k) + opt
                + hw.step_fixed + hw.step_per_action * actions_floor(c))

    def memory_floor(self, c: Config) -> float:
        """A lower bound on the fullest GPU's bytes without the schedule, where the family says how much it
        holds (``Family.holds_all``: every micro-batch of every stage at once): the average of every rank's
        state and its m micro-batches' kept bytes. 0 for the others."""
        fam = FAMILIES.get(c.family)
        if fam is None or not fam.holds_all:
            return 0.0
        lc = layer_costs(self.profile, c.mbs, c.recompute, self.cluster.state_factor, self.cluster)
        kept = min(lc.input_bytes) * c.p * c.v if lc.input_bytes else sum(lc.act)  # a recomputed piece: its input
        return (sum(lc.fixed) + c.m * kept) / c.p

    def _opt_share(self, dp: int) -> int:
        """How many replicas split the optimizer step."""
        return 1 if self.sharding == "ddp" else self.shard if self.sharding == "hsdp" else dp

    def prepare(self, c: Config) -> Prepared:
        """Split, memory and lower bound of ``c`` (no simulation)."""
        sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
        prof, cl = self.profile, self.cluster
        counts = self._split(h, c)
        lc = layer_costs(prof, c.mbs, c.recompute, cl.state_factor, cl)
        part = evaluate_split(lc, h, counts, cl.memory)
        replay = self.replay.get(c.mbs, 0.0)
        if max(part.rank_memory) + replay > cl.memory * (1 + 1e-9):  # too big: the partition's own memory says so
            return Prepared(config=c, counts=counts, memory=tuple(x + replay for x in part.rank_memory),
                            activations=(), fits=False, bound=float("inf"), step_end=0.0, optimizer=0.0,
                            costs=None)
        costs = stage_costs(prof, counts, h, c.mbs, c.recompute, cl, c.p, c.dp)
        resolved = costs.resolve(sched.stages)
        acts = peak_activation_bytes(h, resolved.activation_bytes)
        fixed = rank_fixed_bytes(prof, counts, h, cl.state_factor, cl)
        gathered = rank_fixed_bytes(prof, counts, h, gathered_factor(self.sharding)) if self.sharding in (
            "fsdp", "hsdp") else [0.0] * h.ranks
        transient = rank_transient_bytes(prof, counts, h, c.mbs, c.recompute)
        memory = tuple(f + a + x + replay for f, a, x in zip(fixed, acts, transient))
        r = max(range(h.ranks), key=memory.__getitem__)
        parts = MemoryParts(state=fixed[r] - gathered[r], gathered=gathered[r], activations=acts[r],
                            transient=transient[r] + replay)
        opt = max(rank_optimizer_time(prof, counts, h)) / self._opt_share(c.dp)
        end = step_sync_time(prof, counts, h, cl, c.p, c.dp) + opt
        split = FAMILIES[c.family].split_backward if c.family in FAMILIES else True
        fill = 0.0 if self.long_step(c) else pipeline_bound(sched, resolved, split)  # the stand-in is shorter
        over = self.job.hardware.step_overhead(max(len(prog) for prog in sched.programs) * _steps(self.long_step(c), c.m))
        bound = max(c.m * part.bottleneck, fill) + end + over
        return Prepared(config=c, counts=counts, memory=memory, activations=acts,
                        fits=max(memory) <= cl.memory * (1 + 1e-9), bound=max(bound, self.floor(c)), step_end=end,
                        optimizer=opt, costs=costs, free=counts == self._free_split(h, c), parts=parts)

    def _free_split(self, h, c: Config) -> tuple[int, ...] | None:
        """The block water-fill without a memory limit (cached per holding), where it applies."""
        key = ("free", h, c.mbs, c.recompute)
        if key not in self._partitions:
            lc = layer_costs(self.profile, c.mbs, c.recompute, self.cluster.state_factor, self.cluster)
            self._partitions[key] = block_split(lc, h, None) if is_block_model(lc) else None
        return self._partitions[key]

    @property
    def gather_scale(self) -> float:
        """Bytes all-gathered per bf16 weight byte (halved with FP8 weights)."""
        return self.job.gather_scale

    def _gather(self, c: Config, counts, h, fixed: list[float]) -> float:
        """ZeRO-1's all-gather of the updated weights over the data-parallel group."""
        cl = self.cluster
        weights = max(_rank_weights(self.profile, counts, h))
        return reduce_scatter_time(weights * self.gather_scale, c.dp, dp_link(cl, c.p, c.dp))

    def _reduction_bytes(self, counts) -> list[list[float]]:
        """Per piece, the gradient bytes of each layer that the data-parallel reduction moves."""
        return _piece_layer_bytes(self.profile, counts)

    def _split(self, h, c: Config) -> tuple[int, ...]:
        """The block water-fill where it applies (cached per holding), else the exact partitioner."""
        lc = layer_costs(self.profile, c.mbs, c.recompute, self.cluster.state_factor, self.cluster)
        key = ("blocks", h, c.mbs, c.recompute)
        if key not in self._partitions:
            room = self.cluster.memory - self.replay.get(c.mbs, 0.0)  # leave room for the block being replayed
            counts = block_split(lc, h, room) if is_block_model(lc) else None
            if counts is None and is_block_model(lc):
                counts = block_split(lc, h, None)  # nothing fits: the fastest split, flagged by memory
            self._partitions[key] = counts
        counts = self._partitions[key]
        return counts if counts is not None else self._partition(h, c).counts

    def finish(self, pre: Prepared, fw: Framework | None = None) -> "ClusterCandidate":
        """Simulate a prepared configuration and add the data-parallel traffic as ``fw``'s rules say (the
        first of ``frameworks`` by default)."""
        fw = fw or self.frameworks[0]
        c = pre.config
        sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
        prof, cl, hw = self.profile, self.cluster, self.job.hardware
        key = (c, fw.blocking_p2p)
        if key not in self._timelines:
            costs = blocking_p2p(pre.costs, h) if fw.blocking_p2p else pre.costs
            self._timelines[key] = self._play(c, sched, costs)
        tl, makespan, bubble = self._timelines[key]
        layer_bytes = self._reduction_bytes(pre.counts)
        exposed, gather = self._traffic(tl, layer_bytes, h, pre, fw)
        over = hw.step_overhead(max(len(prog) for prog in sched.programs) * _steps(self.long_step(c), c.m))
        step = makespan + exposed + gather + pre.step_end + over
        tokens = self.global_batch * self.job.spec.seq
        cand = Candidate(config=c, counts=pre.counts, layout=format_layout(prof.symbols, pre.counts),
                         step_time=step, makespan=makespan,
                         allreduce=step - makespan - pre.optimizer - over, optimizer=pre.optimizer, overhead=over,
                         throughput=self.global_batch / step, bubble=bubble, memory=pre.memory,
                         activations=pre.activations, fits=pre.fits, schedule=sched)
        mfu = self.job.spec.model_flops_per_token() * tokens / (step * self.job.gpus * hw.peak_flops)
        long = self.long_step(c)
        return ClusterCandidate(t=self.t, candidate=cand, exposed_dp=exposed, mfu=mfu,
                                tokens_per_second=tokens / step, recompute=self.recompute, framework=fw.name,
                                sharding=self.sharding, shard=self.shard, exposed_gather=gather,
                                usable=cl.memory, band=hw.band, costed_from=long[0] if long else None,
                                memory_band=hw.memory_band, memory_parts=pre.parts,
                                fragmentation=self.job.memory_reserve.fragmentation * hw.memory)

    def _play(self, c: Config, sched, costs) -> tuple:
        """(timeline, makespan, bubble) of ``c``: simulated, or for a long step extended from its shorter ones
        (``steady``; the timeline is the ``2 mc`` one, whose start and end the traffic rules read)."""
        tl = simulate(sched, costs, check=False)
        span, bubble = timing(tl)
        long = self.long_step(c)
        if long is None:
            return tl, span, bubble
        mc, short = long
        span1, bubble1 = timing(simulate(short, costs, check=False))
        ranks = sched.ranks
        makespan, busy = extend((span1, (1 - bubble1) * ranks * span1), (span, (1 - bubble) * ranks * span), mc, c.m)
        return tl, makespan, 1 - busy / (ranks * makespan)

    def _traffic(self, tl, layer_bytes, h, pre: Prepared, fw: Framework) -> tuple[float, float]:
        """(exposed gradient reduction, exposed weight gathers) of a timeline under ``fw``'s rules."""
        c, cl, mode = pre.config, self.cluster, self.sharding
        link = dp_link(cl, c.p, c.dp)
        group = self.shard if mode == "hsdp" else c.dp
        shard_link = dp_link(cl, c.p, group)
        cost = reduction_cost(mode, c.dp, self.shard, shard_link if mode == "hsdp" else link, cl.inter)
        sharded = mode in ("fsdp", "hsdp")
        rule = fw.fsdp_reduce if sharded else fw.reduce
        exposed = exposed_reduction(tl, layer_bytes, h.stage_piece, c.dp, link, rule=rule, cost=cost)
        if mode == "ddp" or group == 1:
            return exposed, 0.0
        unit = fw.fsdp_gather if sharded else fw.gather
        if unit == "end":  # after the optimizer step: the rank's whole shard, exposed
            fixed = rank_fixed_bytes(self.profile, pre.counts, h, cl.state_factor, cl)
            return exposed, self._gather(c, pre.counts, h, fixed)
        g = self.gather_scale
        return exposed, exposed_gather(tl, layer_bytes, h.stage_piece, unit,
                                       lambda nbytes: reduce_scatter_time(nbytes * g, group, shard_link))


def _steps(long, m: int) -> float:
    """Scale from a schedule's actions per rank to the step's: a long step's stand-in has 2 mc micro-batches."""
    return 1.0 if long is None else m / (2 * long[0])


def actions_floor(c: Config) -> int:
    """The fewest ops a rank runs in ``c``'s step: each of its stages' micro-batches needs an F and a B (or I
    and W); an F&B pair holds at most one F (DualPipe's two lanes share the micro-batches)."""
    fam = FAMILIES.get(c.family)
    if fam is None:
        return 0
    units = c.m * c.v // fam.param_copies
    return units if fam.pairs is not None else units * (3 if fam.split_backward else 2)


def fill_floor(family: str, p: int, layers, k: int) -> float:
    """The average over ranks of the least fill and drain any split gives, without the schedule.

    Rank r's first op is a forward of its first stage, d_r stages into its lane (d_r = r; with two lanes,
    DualPipe's, min(r, p - 1 - r)), so it waits for d_r pieces' forwards, all but the embedding's of at least
    one layer; without a split backward its last op is a backward, after which as many pieces' backwards run.
    The makespan is at least every rank's fill + work + drain, so at least their average."""
    fam = FAMILIES.get(family)
    if fam is None or p < 3:
        return 0.0
    f = min(x.t_f[k] for x in layers[1:])
    b = 0.0 if fam.split_backward else min(x.t_b[k] for x in layers[1:])
    lanes = fam.param_copies
    chain = sum(max((r if lanes == 1 else min(r, p - 1 - r)) - 1, 0) for r in range(p))
    return chain / p * (f + b)


def pipeline_bound(sched, sc, split_backward: bool) -> float:
    """A lower bound on the makespan, per rank: its earliest start + its work + its latest drain.

    A rank's first op is a forward, which waits for the forwards of the stages before it in its lane
    (one micro-batch's chain); its last op, without a split backward, is a backward, after which the
    backwards of the stages before it must run. Links only add to both, so the bound holds for any order.
    """
    if sc.fb is not None:  # an overlapped pair may cost less than its halves: no per-op sum is safe
        return 0.0
    before_f, before_b = [0.0] * sched.stages, [0.0] * sched.stages
    share = [0] * sched.stages
    for lane in sched.lanes:
        f = b = 0.0
        for st in lane.stages:
            before_f[st], before_b[st], share[st] = f, b, lane.mb_hi - lane.mb_lo
            f, b = f + sc.f[st], b + sc.b[st]
    best = 0.0
    for r in range(sched.ranks):
        stages = sched.stages_of_rank(r)
        back = [sc.i[st] + sc.w[st] if split_backward else sc.b[st] for st in stages]
        work = sum(share[st] * (sc.f[st] + bk) for st, bk in zip(stages, back))
        drain = 0.0 if split_backward else min(before_b[st] for st in stages)
        best = max(best, min(before_f[st] for st in stages) + work + drain)
    return best


def dp_link(cl: Cluster, p: int, dp: int) -> Link:
    """The link data-parallel peers use: inside the node when all replicas fit in one (or the cluster's
    own rule, ``data_parallel_link``, for another device order)."""
    own = getattr(cl, "data_parallel_link", None)
    if own is not None:
        return own(p, dp)
    return cl.inter if dp > 1 and p * dp > cl.per_node else cl.intra


def _rank_weights(prof, counts, h) -> list[float]:
    """bf16 weight bytes per rank (over every piece copy it holds)."""
    bounds = [0, *accumulate(counts)]
    per_piece = [sum(x.param_bytes for x in prof.layers[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
    return [sum(per_piece[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)]


def _piece_layer_bytes(prof, counts) -> list[list[float]]:
    bounds = [0, *accumulate(counts)]
    return [[prof.layers[i].param_bytes for i in range(bounds[k], bounds[k + 1])] for k in range(len(counts))]


def searchers(job: Job, skipped: dict, schedules: dict | None = None) -> list[ClusterSearcher]:
    """One searcher per (t, p), recomputation and sharding that could fit, each with the frameworks that run
    it; ``skipped`` collects why others were dropped; ``schedules`` is a cache shared across calls.
    Recomputation is the analytic profile's, so ``Config.recompute`` stays off, except for the runtime's
    whole-stage replay ("stage")."""
    spec, hw = job.spec, job.hardware
    shared: dict = {} if schedules is None else schedules
    out = []
    for t in tensor_degrees(job):
        tp = TensorParallel(t=t, sequence_parallel=job.sequence_parallel, overlap=job.async_tp)
        profiles: dict = {}
        for mode in recompute_modes(job):
            if spec.moe is not None:  # the profile depends on ep too; experts go with ZeRO-1 or ddp
                if mode == "stage":
                    continue
                from .expert_parallel import moe_pipelines

                out += moe_pipelines(job, t, tp, mode, shared, skipped)
                continue
            base = "off" if mode == "stage" else mode
            if base not in profiles:
                profiles[base] = analytic_profile(spec, hw, tp, job.micro_batch_sizes, recompute=base,
                                                  compute=job.compute)
            replay = ({b: replay_bytes(spec, b, tp, linear_factor=job.linear_factor) for b in job.micro_batch_sizes}
                      if mode == "full" else {})
            out += _pipelines(job, t, profiles[base], mode, replay, shared, skipped)
    return out


def recompute_modes(job: Job) -> tuple[str, ...]:
    """``job.recompute``, less "selective" for a flash-attention model where "off" is searched too (it
    keeps no scores, so the two are the same), plus "stage" (the runtime's whole-stage replay) for "full"
    when a framework recomputes that way."""
    modes = job.recompute
    if "off" in modes and not _selective_drops(job):
        modes = tuple(m for m in modes if m != "selective")
    if "full" in modes and any(fw.stage_recompute for fw in job.frameworks):
        modes += ("stage",)
    return tuple(m for m in modes if _runners(job, m))


def _selective_drops(job: Job) -> bool:
    """Whether "selective" keeps less than "off" for this model: a flash-attention model keeps no scores, so
    recomputing the attention core alone drops nothing."""
    spec = job.spec
    kinds = {spec.block_kind(i) for i in range(spec.layers)}
    return any(dropped_modules(spec, k, job.recompute_modules) for k in kinds)


def _runners(job: Job, mode: str, sharding: str | None = None) -> tuple[Framework, ...]:
    """The job's frameworks that recompute as ``mode`` says (and run ``sharding``, and overlap tensor-parallel
    collectives when the job asks for it)."""
    return tuple(fw for fw in job.frameworks if _recomputes(fw, mode)
                 and (sharding is None or sharding in shardings(job, fw)) and (fw.async_tp or not job.async_tp))


def _recomputes(fw: Framework, mode: str) -> bool:
    """Whether ``fw`` recomputes as ``mode`` says: "stage" is full recomputation where a framework replays a
    whole stage, "full" where it replays block by block."""
    if mode in ("full", "stage"):
        return "full" in fw.recompute and fw.stage_recompute == (mode == "stage")
    return mode in fw.recompute


def _groups(job: Job, dp: int, mode: str, skipped: dict | None = None) -> list[tuple[str, int | None]]:
    """(sharding, HSDP shard group) pairs searched at ``dp`` replicas by some framework running ``mode``."""
    out = []
    for sh in dict.fromkeys(x for fw in _runners(job, mode) for x in shardings(job, fw)):
        if sh == "hsdp":
            groups = [(sh, g) for g in job.hsdp_shards if 1 < g < dp and dp % g == 0]
            if not groups and skipped is not None:
                why = (f"--hsdp-shard {','.join(map(str, job.hsdp_shards))}: an HSDP shard group must divide the "
                       "data-parallel ranks with more than one group (1 < shard < dp)")
                skipped[why] = skipped.get(why, 0) + 1
            out += groups
        else:
            out.append((sh, None))
    return out


def _pipelines(job: Job, t: int, prof, mode: str, replay: dict, shared: dict,
               skipped: dict) -> list[ClusterSearcher]:
    hw = job.hardware
    ranks = job.gpus // t
    weights = sum(x.param_bytes for x in prof.layers)
    usable = job.usable
    out = []
    for p in job.pipeline or [p for p in range(1, min(ranks, len(prof.layers)) + 1) if ranks % p == 0]:
        if ranks % p or p > len(prof.layers):
            continue
        dp = ranks // p
        for sharding, shard in _groups(job, dp, mode, skipped):
            factor = state_factor(dp, sharding=sharding, shard=shard) + job.weight_extra
            if weights * factor / p > usable:
                why = "weights, gradients and optimizer state alone exceed the GPU's usable memory"
                if mode == recompute_modes(job)[0]:  # once per layout, whatever the recomputation
                    skipped[why] = skipped.get(why, 0) + 1
                continue
            par = Parallelism.of_plan(p=p, dp=dp, t=t, sharding=sharding, shard=shard)
            runners = offered(_runners(job, mode, sharding), par, skipped)
            families = _families(job, runners, skipped)
            if not families:
                continue
            cl = _OnePipeline(devices=ranks, per_node=max(1, hw.gpus_per_node // t), memory=usable,
                              intra=hw.intra, inter=hw.inter, state_factor=factor, pipeline=p)
            out.append(ClusterSearcher(profile=prof, cluster=cl, global_batch=job.global_batch, job=job, t=t,
                                       space=replace(job.space, families=families,
                                                     recompute=(mode == "stage",)),
                                       recompute=mode, replay=replay, sharding=sharding, shard=shard,
                                       frameworks=runners, _schedules=shared, skipped=skipped))
    return out


def _families(job: Job, runners: tuple[Framework, ...], skipped: dict | None = None) -> tuple[str, ...]:
    """The families the job asks for that one of ``runners`` runs (``skipped`` collects the others, in
    the frameworks' words)."""
    asked = job.space.families or tuple(FAMILIES)
    out = tuple(f for f in asked if any(fw.runs(f) for fw in runners))
    if skipped is not None and runners:
        for f in asked:
            if f not in out:
                runs = "; ".join(f"{fw.title} runs {', '.join(fw.families)}" for fw in job.frameworks if fw.families)
                why = f"--schedules {f}: no framework asked for runs it ({runs})"
                skipped[why] = skipped.get(why, 0) + 1
    return out


def offered(runners: tuple[Framework, ...], par: Parallelism, skipped: dict) -> tuple[Framework, ...]:
    """``runners`` less those that cannot express the layout (``frameworks.refusal``); ``skipped`` collects
    why, per framework, for the plan to say."""
    from .frameworks import refusal

    out = []
    for fw in runners:
        why = refusal(fw.name, par)
        if why is None:
            out.append(fw)
        else:
            key = f"not offered for {fw.title}: {why}"
            skipped[key] = skipped.get(key, 0) + 1
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Result:
    """The ranking and how it was found."""

    ranking: list  #: ClusterCandidate, fastest first (fitting ones only), every framework's
    configurations: int  #: enumerated (each with a sharding, costed for each framework that runs it)
    simulated: int
    #: fitting, but slower for sure: a lower bound above the top ``keep``, or recomputation where the
    #: same configuration with less fits
    pruned: int
    too_big: int  #: did not fit in the GPU's usable memory
    least_memory: Prepared | None = None  #: the configuration that needs the least, when nothing fits
    #: of ``pruned``: dropped by the schedule-free bound, before their schedule was built
    unbuilt: int = 0
    #: of ``pruned``: the same configuration with less recomputation fits
    dominated: int = 0
    best: dict = field(default_factory=dict)  #: framework name -> its fastest ClusterCandidate (exact)
    #: why a framework was not offered some layouts (``frameworks.refusal``) -> how many
    not_offered: dict = field(default_factory=dict)


def cluster_search(job: Job, progress: Callable[[int, int], None] | None = None, keep: int = 10,
                   per_layout: bool = False, schedules: dict | None = None, floors: bool = True) -> Result:
    """The ``keep`` fastest configurations that fit, exactly, and each framework's fastest: best-first by
    lower bound, a configuration's schedule is built only while its schedule-free bound
    (``ClusterSearcher.floor``) can reach the top, and it is simulated only while its prepared bound
    (``Prepared.bound``) can (with ``per_layout``, also each t x p grid's best is exact). ``floors`` False
    builds and prepares every configuration before simulating any (benchmarks/bench_cluster_plan.py's baseline)."""
    check_job(job)
    with gc_paused():  # thousands of schedules and no cycles: the collector's rescans cost a quarter of the search
        return _search(job, progress, keep, per_layout, schedules, floors)


def _search(job: Job, progress, keep: int, per_layout: bool, schedules: dict | None, floors: bool) -> Result:
    skipped: dict = {}
    found = searchers(job, skipped, schedules)
    if not found:
        raise PlanError(_nothing_offered(job, skipped) or _weights_do_not_fit(job))
    work = [(s, c) for s in found for c in s.configs(build=False)]
    if not work:
        raise PlanError(_nothing_to_search(job, skipped))
    search = _BestFirst(keep=keep, per_layout=per_layout, floors=floors)
    out, counts = search.run(work, progress)
    if not out:
        least = min(counts.pop("prepared"), key=lambda x: max(x.memory), default=None)
        return Result(ranking=[], configurations=len(work), simulated=0, pruned=counts["unbuilt"],
                      too_big=counts["too_big"], least_memory=least, unbuilt=counts["unbuilt"])
    out.sort(key=lambda g: (g.step_time, max(g.candidate.memory)))
    best = {}
    for g in out:
        best.setdefault(g.framework, g)
    pruned = len(work) - counts["too_big"] - counts["simulated"]
    return Result(ranking=out, configurations=len(work), simulated=counts["simulated"], pruned=pruned,
                  too_big=counts["too_big"], unbuilt=counts["unbuilt"], dominated=counts["dominated"], best=best,
                  not_offered={k: n for k, n in skipped.items() if k.startswith("not offered for ")})


@dataclass(kw_only=True)
class _BestFirst:
    """The lazy, exact search: mutable only for its running bests."""

    keep: int
    per_layout: bool
    floors: bool = True  #: prune by the schedule-free bound (False: build every configuration's schedule first)
    best: list = field(default_factory=list)  # a max-heap (negated) of the keep fastest steps so far
    by_framework: dict = field(default_factory=dict)  # framework -> its fastest step so far
    by_grid: dict = field(default_factory=dict)  # (t, p) -> its fastest step so far

    def useless(self, bound: float, s: ClusterSearcher, family: str, p: int) -> bool:
        """Whether nothing with this lower bound can enter the top, a framework's best or (per_layout) its
        grid's best."""
        if len(self.best) < self.keep or bound <= -self.best[0]:
            return False
        if any(bound <= self.by_framework.get(fw.name, float("inf")) for fw in s.frameworks if fw.runs(family)):
            return False
        return not self.per_layout or (s.t, p) in self.by_grid and bound > self.by_grid[(s.t, p)]

    def record(self, got: "ClusterCandidate") -> None:
        heapq.heappush(self.best, -got.step_time)
        if len(self.best) > self.keep:
            heapq.heappop(self.best)
        fw, grid = got.framework, (got.t, got.config.p)
        self.by_framework[fw] = min(self.by_framework.get(fw, float("inf")), got.step_time)
        self.by_grid[grid] = min(self.by_grid.get(grid, float("inf")), got.step_time)

    def run(self, work, progress) -> tuple[list, dict]:
        counts = {"simulated": 0, "too_big": 0, "unbuilt": 0, "dominated": 0, "prepared": []}
        # more recomputation only adds work: a configuration is dominated where the same one with less fits
        fits_at: dict = {}  # (t, ep, p, sharding, shard, config without recomputation) -> [(level, frameworks)]
        free_fits: dict = {}  # (searcher, family, p, m, mbs, recompute) -> fits with its fastest split
        heap = [(s.floor(c) if self.floors else -1.0, n, 0, s, c) for n, (s, c) in enumerate(work)]
        heapq.heapify(heap)
        total, done, out = len(work), 0, []
        while heap:
            bound, n, stage, s, item = heapq.heappop(heap)
            c = item if stage == 0 else item.config
            if self.useless(bound, s, c.family, c.p):
                if stage == 0:
                    counts["unbuilt"] += 1
                done += 1
                continue
            if stage == 0:  # build the schedule, split and memory; queue it again by its tighter bound
                bases = TRADES_BUBBLE_FOR_MEMORY.get(c.family, ())
                if any(free_fits.get((id(s), b, c.p, c.m, c.mbs, c.recompute)) for b in bases):
                    counts["dominated"] += 1  # the base family fits with its fastest split: it is faster
                    done += 1
                    continue
                if s.memory_floor(c) > s.cluster.memory * (1 + 1e-9):  # too big for sure, without its schedule
                    counts["too_big"] += 1
                    done += 1
                    continue
                if s._schedule(c.family, c.p, c.m, c.v) is None:
                    done += 1
                    continue
                pre = s.prepare(c)
                if not pre.fits:
                    counts["too_big"] += 1
                    if not out:
                        counts["prepared"].append(pre)
                    done += 1
                    continue
                key = (s.t, s.ep, c.p, s.sharding, s.shard, _without_rc(c))
                fits_at.setdefault(key, []).append((_level(s, c), {fw.name for fw in s.frameworks}))
                if pre.free:
                    free_fits[(id(s), c.family, c.p, c.m, c.mbs, c.recompute)] = True
                heapq.heappush(heap, (pre.bound, n, 1, s, pre))
                continue
            mine = {fw.name for fw in s.frameworks}
            if any(level < _level(s, c) and mine <= fws
                   for level, fws in fits_at[(s.t, s.ep, c.p, s.sharding, s.shard, _without_rc(c))]):
                counts["dominated"] += 1
                done += 1
                continue
            for fw in s.frameworks:
                if fw.runs(c.family):
                    got = s.finish(item, fw)
                    out.append(got)
                    self.record(got)
            counts["simulated"] += 1
            done += 1
            if progress:
                progress(done, total)
        return out, counts


#: the skip reasons that are the options' own doing (a framework that cannot run what was asked), not memory
_NOT_OFFERED = ("not offered for ", "--schedules ", "--hsdp-shard ")


def _nothing_offered(job: Job, skipped: dict) -> str | None:
    """The real culprit when no searcher was made and the options, not memory, left nothing: a framework that
    does not run the schedules asked for, a layout no framework asked for can express, HSDP shard groups that
    divide no data-parallel degree."""
    why = [k for k in skipped if k.startswith(_NOT_OFFERED)]
    if not why or any(k.startswith("weights, gradients") for k in skipped):
        return None
    return f"--gpus {job.gpus}: nothing to search: " + "; ".join(why)


def _weights_do_not_fit(job: Job) -> str:
    from .cluster import fmt_bytes

    hw = job.hardware
    need = 2 * job.spec.params() * state_factor(1, job.zero) / job.gpus
    reserve = job.memory_reserve.bytes(hw.memory)
    room = (f"the {fmt_bytes(job.usable)} usable of --hardware {hw.name}'s {fmt_bytes(hw.memory)} (less the "
            f"--memory-reserve {job.memory_reserve.describe(hw.memory)})" if reserve else
            f"the {fmt_bytes(hw.memory)} of --hardware {hw.name}")
    return (f"--gpus {job.gpus}: {job.spec.name}'s weights, fp32 gradients and optimizer state need at least "
            f"{fmt_bytes(need)} per GPU split over all {job.gpus} GPUs, more than {room}; give more --gpus or a "
            f"GPU with more memory")


def _level(s: ClusterSearcher, c: Config) -> int:
    """0 off, 1 selective, 2 full, 3 the whole stage (``_LEVEL``)."""
    return _LEVEL[s.recompute]


def _without_rc(c: Config) -> Config:
    return Config(family=c.family, p=c.p, dp=c.dp, v=c.v, m=c.m, mbs=c.mbs, recompute=False)
