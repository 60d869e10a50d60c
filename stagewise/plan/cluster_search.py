"""Search at cluster scale: tensor x pipeline x data parallel, family, v, micro-batch size, recomputation, split.

For each tensor-parallel degree t the model gets an analytic profile (one GPU of
a t-group); the rest is the ordinary search: the same schedules, a split of
identical blocks (``block_split``: the first and last stage get fewer blocks
when the embedding, the head or the warm-up activations make them heavier) and
the one simulator. Recomputation (off, selective, full) is the analytic
profile's: full checkpoints each block, as Megatron-LM and torchtitan do, so the
generic ``Config.recompute`` (a whole stage replayed, the runtime's way) stays
off here. What this module adds is the cluster around the pipeline:
ZeRO-1 memory over dp and the data-parallel gradient reduction overlapped with
the remaining backward (``data_parallel``); the job and its rules are in
``cluster_job``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import accumulate
from typing import Callable, NamedTuple

from ..costs import Costs
from ..schedules import FAMILIES
from ..simulate import simulate
from .analytic import RECOMPUTE, TensorParallel, analytic_profile, replay_bytes
from .block_split import block_split, is_block_model
from .cluster import Cluster
from .cluster_job import Job, _nothing_to_search, check_job, state_factor, tensor_degrees
from .data_parallel import exposed_reduction, reduce_scatter_time
from .errors import PlanError
from ..layout import format_layout
from .model import layer_costs, rank_fixed_bytes, rank_optimizer_time, rank_transient_bytes, stage_costs, step_sync_time
from .partition import evaluate as evaluate_split
from .profile import Link
from .search import Candidate, Config, Searcher, peak_activation_bytes, timing

__all__ = ["ClusterCandidate", "ClusterSearcher", "Job", "Result", "check_job", "cluster_search", "searchers",
           "state_factor", "tensor_degrees"]


@dataclass(frozen=True, kw_only=True)
class ClusterCandidate:
    """A simulated configuration with its tensor-parallel degree and cluster figures."""

    t: int
    candidate: Candidate
    exposed_dp: float  #: seconds of gradient reduce-scatter not hidden behind the backward
    mfu: float  #: model FLOPs per second / (GPUs x peak)
    tokens_per_second: float
    recompute: str = "off"  #: of ``RECOMPUTE``: what the blocks recompute (the profile's; config.recompute is off)
    ep: int = 1  #: expert-parallel degree (MoE models): routed experts sharded over ep of a stage's dp peers
    ep_nodes: int = 1  #: nodes one expert-parallel group spans (1: its all-to-all stays inside a node)

    @property
    def config(self) -> Config:
        return self.candidate.config

    @property
    def step_time(self) -> float:
        return self.candidate.step_time

    @property
    def fits(self) -> bool:
        return self.candidate.fits

    def label(self) -> str:
        ep = f" ep={self.ep}" if self.ep > 1 else ""
        return f"t={self.t}{ep} {self.config.label()} recompute={self.recompute}"

    def to_dict(self) -> dict:
        return {"t": self.t, "ep": self.ep, "ep_nodes": self.ep_nodes, **self.candidate.to_dict(),
                "recompute": self.recompute,
                "exposed_dp": self.exposed_dp, "mfu": self.mfu,
                "tokens_per_second": self.tokens_per_second}


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
    step_end: float  #: weight all-gather + tied-weight and loss sums + optimizer step
    optimizer: float
    costs: Costs  #: what the simulator plays


@dataclass(kw_only=True)
class ClusterSearcher(Searcher):
    """A Searcher for one (t, p): analytic profile, ZeRO-1 memory, overlapped data-parallel reduction."""

    job: Job
    t: int
    recompute: str = "off"  #: of ``RECOMPUTE``: what the profile's blocks recompute
    ep: int = 1  #: expert-parallel degree (``expert_parallel.MoESearcher``)
    replay: dict = field(default_factory=dict)  #: mbs -> bytes of the one block replayed (full recomputation)

    def prepare(self, c: Config) -> Prepared:
        """Split, memory and lower bound of ``c`` (no simulation)."""
        sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
        prof, cl = self.profile, self.cluster
        counts = self._split(h, c)
        lc = layer_costs(prof, c.mbs, c.recompute, cl.state_factor, cl)
        part = evaluate_split(lc, h, counts, cl.memory)
        costs = stage_costs(prof, counts, h, c.mbs, c.recompute, cl, c.p, c.dp)
        resolved = costs.resolve(sched.stages)
        acts = peak_activation_bytes(h, resolved.activation_bytes)
        fixed = rank_fixed_bytes(prof, counts, h, cl.state_factor, cl)
        transient = rank_transient_bytes(prof, counts, h, c.mbs, c.recompute)
        replay = self.replay.get(c.mbs, 0.0)
        memory = tuple(f + a + x + replay for f, a, x in zip(fixed, acts, transient))
        zero = self.job.zero
        gather = self._gather(c, counts, h, fixed) if zero else 0.0
        opt = max(rank_optimizer_time(prof, counts, h)) / (c.dp if zero else 1)
        end = gather + step_sync_time(prof, counts, h, cl, c.p, c.dp) + opt
        split = FAMILIES[c.family].split_backward if c.family in FAMILIES else True
        bound = max(c.m * part.bottleneck, pipeline_bound(sched, resolved, split)) + end
        return Prepared(config=c, counts=counts, memory=memory, activations=acts,
                        fits=max(memory) <= cl.memory * (1 + 1e-9), bound=bound, step_end=end, optimizer=opt,
                        costs=costs)

    def _gather(self, c: Config, counts, h, fixed: list[float]) -> float:
        """ZeRO-1's all-gather of the updated bf16 weights over the data-parallel group."""
        cl = self.cluster
        return reduce_scatter_time(max(fixed) / cl.state_factor, c.dp, dp_link(cl, c.p, c.dp))

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

    def finish(self, pre: Prepared) -> "ClusterCandidate":
        """Simulate a prepared configuration and add the overlapped data-parallel reduction."""
        c = pre.config
        sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
        prof, cl, hw = self.profile, self.cluster, self.job.hardware
        tl = simulate(sched, pre.costs, check=False)
        makespan, bubble = timing(tl)
        exposed = exposed_reduction(tl, self._reduction_bytes(pre.counts), h.stage_piece, c.dp,
                                    dp_link(cl, c.p, c.dp), all_reduce=not self.job.zero)
        step = makespan + exposed + pre.step_end
        tokens = self.global_batch * self.job.spec.seq
        cand = Candidate(config=c, counts=pre.counts, layout=format_layout(prof.symbols, pre.counts),
                         step_time=step, makespan=makespan,
                         allreduce=step - makespan - pre.optimizer, optimizer=pre.optimizer,
                         throughput=self.global_batch / step, bubble=bubble, memory=pre.memory,
                         activations=pre.activations, fits=pre.fits, schedule=sched)
        mfu = self.job.spec.model_flops_per_token() * tokens / (step * self.job.gpus * hw.peak_flops)
        return ClusterCandidate(t=self.t, candidate=cand, exposed_dp=exposed, mfu=mfu,
                                tokens_per_second=tokens / step, recompute=self.recompute)


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


def _piece_layer_bytes(prof, counts) -> list[list[float]]:
    bounds = [0, *accumulate(counts)]
    return [[prof.layers[i].param_bytes for i in range(bounds[k], bounds[k + 1])] for k in range(len(counts))]


def searchers(job: Job, skipped: dict) -> list[ClusterSearcher]:
    """One searcher per (t, p) and recomputation (``job.recompute``) that could fit; ``skipped`` collects
    why others were dropped. Recomputation is the analytic profile's, so ``Config.recompute`` stays off."""
    spec, hw = job.spec, job.hardware
    shared: dict = {}
    out = []
    for t in tensor_degrees(job):
        tp = TensorParallel(t=t, sequence_parallel=job.sequence_parallel)
        for mode in recompute_modes(job):
            if spec.moe is not None:  # the profile depends on ep too
                from .expert_parallel import moe_pipelines

                out += moe_pipelines(job, t, tp, mode, shared, skipped)
                continue
            prof = analytic_profile(spec, hw, tp, job.micro_batch_sizes, recompute=mode)
            replay = {b: replay_bytes(spec, b, tp) for b in job.micro_batch_sizes} if mode == "full" else {}
            out += _pipelines(job, t, prof, mode, replay, shared, skipped)
    return out


def recompute_modes(job: Job) -> tuple[str, ...]:
    """``job.recompute``, less "selective" for a flash-attention model where "off" is searched too: it
    keeps no scores, so the two are the same."""
    modes = job.recompute
    if job.spec.flash_attention and "off" in modes:
        return tuple(m for m in modes if m != "selective")
    return modes


def _pipelines(job: Job, t: int, prof, mode: str, replay: dict, shared: dict,
               skipped: dict) -> list[ClusterSearcher]:
    hw = job.hardware
    ranks = job.gpus // t
    weights = sum(x.param_bytes for x in prof.layers)
    out = []
    for p in job.pipeline or [p for p in range(1, ranks + 1) if ranks % p == 0]:
        if ranks % p or p > len(prof.layers):
            continue
        dp = ranks // p
        if weights * state_factor(dp, job.zero) / p > hw.memory:
            why = "weights, gradients and optimizer state alone exceed the GPU's memory"
            if mode == recompute_modes(job)[0]:  # once per layout, whatever the recomputation
                skipped[why] = skipped.get(why, 0) + 1
            continue
        cl = _OnePipeline(devices=ranks, per_node=max(1, hw.gpus_per_node // t), memory=hw.memory,
                          intra=hw.intra, inter=hw.inter, state_factor=state_factor(dp, job.zero), pipeline=p)
        out.append(ClusterSearcher(profile=prof, cluster=cl, global_batch=job.global_batch, job=job, t=t,
                                   space=replace(job.space, recompute=(False,)), recompute=mode, replay=replay,
                                   _schedules=shared, skipped=skipped))
    return out


@dataclass(frozen=True, kw_only=True)
class Result:
    """The ranking and how it was found."""

    ranking: list  #: ClusterCandidate, fastest first (fitting ones only)
    configurations: int  #: enumerated
    simulated: int
    #: fitting, but slower for sure: a lower bound above the top ``keep``, or recomputation where the
    #: same configuration without it fits
    pruned: int
    too_big: int  #: did not fit in the GPU's memory
    least_memory: Prepared | None = None  #: the configuration that needs the least, when nothing fits


def cluster_search(job: Job, progress: Callable[[int, int], None] | None = None, keep: int = 10,
                   per_layout: bool = False) -> Result:
    """The ``keep`` fastest configurations that fit, exactly: a configuration is simulated unless its
    lower bound (``Prepared.bound``) is already slower than the ``keep``-th best simulated step
    (with ``per_layout``, also than the best of its own t x p grid, so every grid's best is exact)."""
    check_job(job)
    skipped: dict = {}
    found = searchers(job, skipped)
    if not found:
        raise PlanError(_weights_do_not_fit(job))
    work = [(s, c) for s in found for c in s.configs()]
    if not work:
        raise PlanError(_nothing_to_search(job, skipped))
    total = 2 * len(work)
    prepared = []
    for n, (s, c) in enumerate(work, 1):
        prepared.append((s, s.prepare(c)))
        if progress:
            progress(n, total)
    # more recomputation only adds work (off < selective < full): skip a configuration where the same
    # one with less recomputation fits
    least: dict = {}
    for s, x in prepared:
        if x.fits:
            key = (s.t, s.ep, s.cluster.pipeline, _without_rc(x.config))
            least[key] = min(least.get(key, 9), _level(s, x.config))
    fitting = sorted(((s, x) for s, x in prepared if x.fits
                      and least[(s.t, s.ep, s.cluster.pipeline, _without_rc(x.config))] == _level(s, x.config)),
                     key=lambda sx: sx[1].bound)
    dominated = sum(x.fits for _, x in prepared) - len(fitting)
    if not fitting:
        return Result(ranking=[], configurations=len(work), simulated=0, pruned=0, too_big=len(prepared),
                      least_memory=min((x for _, x in prepared), key=lambda x: max(x.memory)))
    best: list[float] = []  # a max-heap (negated) of the keep fastest steps so far
    grid_best: dict[tuple[int, int], float] = {}  # per t x p grid
    out = []
    for n, (s, x) in enumerate(fitting, 1):
        grid = (s.t, x.config.p)
        if len(best) >= keep and x.bound > -best[0] and (
                not per_layout or (grid in grid_best and x.bound > grid_best[grid])):
            continue
        got = s.finish(x)
        out.append(got)
        grid_best[grid] = min(grid_best.get(grid, float("inf")), got.step_time)
        heapq.heappush(best, -got.step_time)
        if len(best) > keep:
            heapq.heappop(best)
        if progress:
            progress(len(work) + n * len(work) // len(fitting), total)
    if progress:
        progress(total, total)
    out.sort(key=lambda g: (g.step_time, max(g.candidate.memory)))
    return Result(ranking=out, configurations=len(work), simulated=len(out),
                  pruned=len(fitting) - len(out) + dominated, too_big=len(prepared) - len(fitting) - dominated)


def _weights_do_not_fit(job: Job) -> str:
    from .cluster import fmt_bytes

    need = 2 * job.spec.params() * state_factor(1, job.zero) / job.gpus
    return (f"--gpus {job.gpus}: {job.spec.name}'s weights, fp32 gradients and optimizer state need at least "
            f"{fmt_bytes(need)} per GPU split over all {job.gpus} GPUs, more than the {fmt_bytes(job.hardware.memory)} "
            f"of --hardware {job.hardware.name}; give more --gpus or a GPU with more memory")


def _level(s: ClusterSearcher, c: Config) -> int:
    """0 off, 1 selective, 2 full (``RECOMPUTE``'s order)."""
    return RECOMPUTE.index(s.recompute) + (3 if c.recompute else 0)


def _without_rc(c: Config) -> Config:
    return Config(family=c.family, p=c.p, dp=c.dp, v=c.v, m=c.m, mbs=c.mbs, recompute=False)
