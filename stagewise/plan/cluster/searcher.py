"""One cluster searcher: a layout (t, p, the expert layout and device order, the sharding, recomputation)
costed analytically, its configurations floored without schedules, prepared (split, memory, a tighter bound)
and simulated, the data-parallel traffic added as each framework's rules say.

A dense model and a mixture of experts are the same searcher: the layout's ``StageGrid`` says where the GPUs
sit, the profile's ``expert_param_bytes`` which weights travel over the expert replicas (none for a dense
model, whose rules then reduce to the plain ones). A model whose blocks differ (DeepSeek-V3's dense first
blocks, GPT-OSS's sliding windows) is split by ``block_split``'s water-fill with every block at the blocks'
mean time and memory checked on the real layers (the exact partitioner takes seconds per holding at p = 16);
the configuration is then measured with its real costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import NamedTuple

from ...costs import Costs
from ...split import format_layout
from ...parallelism import Parallelism
from ...schedules import FAMILIES
from ...simulate import simulate
from ..search import (Candidate, Config, LayerCosts, Searcher, block_split, blocking_p2p, busiest_floor, evaluate,
                      exposure, is_block_model, layer_costs, peak_activation_bytes, piece_layer_bytes, rank_fixed_bytes, rank_optimizer_time,
                      rank_transient_bytes, stage_costs, step_sync_time, timing)
from .candidate import ClusterCandidate, MemoryParts
from .data_parallel import (exposed_gather, exposed_reduction, gathered_factor, held_gathered, reduce_scatter_time,
                            reduction_cost)
from .long_sequence import offload_exposure, offloaded_bytes, offloaded_holding, offloading_ranks, sliced_holding
from .lowered import communication, held_memory, overlap
from .job import Job
from .overlap_rules import Framework
from .steady import extend, short_m


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
    gathered: tuple[float, ...] = ()  #: per rank, the bytes held only while gathered (``held_gathered``)
    offloaded: float = 0.0  #: the most bytes one GPU keeps in host memory (``long_sequence.offloaded_bytes``)


@dataclass(kw_only=True)
class ClusterSearcher(Searcher):
    """A Searcher for one layout, recomputation and sharding: analytic profile, sharded memory, and the
    frameworks' overlap rules applied to each simulated timeline."""

    job: Job
    recompute: str = "off"  #: of ``RECOMPUTE``, or "stage" (the generic whole-stage replay, config.recompute)
    replay: dict = field(default_factory=dict)  #: mbs -> bytes of the one block replayed (full recomputation)
    #: of ``parallelism.SHARDINGS``: the mode searched (with one data rank, ``parallelism.sharding`` reads ddp)
    sharding: str = "zero1"
    frameworks: tuple[Framework, ...] = ()  #: those that run this sharding and recomputation
    #: FSDP runs block by block (``Framework.per_block``: the same for every one of ``frameworks``)
    per_block: bool = False
    #: sequence slices per micro-batch (``long_sequence``: the profile is a slice's, m counts units); 1: none
    slices: int = 1
    offload: str = "none"  #: of ``long_sequence.OFFLOAD``: what a rank moves to host memory after a forward
    _timelines: dict = field(default_factory=dict)  #: (config, blocking P2P) -> (timeline, makespan, bubble)

    @property
    def parallelism(self) -> Parallelism:
        """The layout every candidate of this searcher runs: its grid's (``cluster``)."""
        return self.cluster.parallelism

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

    def _holding(self, sched):
        """The schedule's holding with Seq1F1B's longer warm-up (slices) and offloaded units (``long_sequence``)."""
        h = self._sliced(sched)
        return offloaded_holding(h) if self.offload == "all" else h

    def _sliced(self, sched):
        return sliced_holding(super()._holding(sched), self.slices, sched.microbatches)

    def _kept(self, c: Config, sched):
        """(``c``'s holding before offload, per rank whether it offloads), cached per schedule."""
        key = ("offloads", c.family, c.p, c.m, c.v)
        if key not in self._partitions:
            kept = self._sliced(sched)
            self._partitions[key] = (kept, offloading_ranks(kept))
        return self._partitions[key]

    def configs(self, build: bool = True) -> list[Config]:
        """The base configurations; with slices, those whose units make whole micro-batches on every pipeline."""
        out = super().configs(build)
        return out if self.slices == 1 else [c for c in out if c.m % self.slices == 0]

    @property
    def sequences(self) -> int:
        """Sequences per step (``global_batch`` counts units: a sequence is ``slices`` of them)."""
        return self.global_batch // self.slices

    def _named_families(self) -> bool:
        """The job's families, not those its frameworks run (``space.families``, always set here)."""
        return bool(self.job.space.families)

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
        time = tuple(x.t_f[k] * (2 if c.recompute else 1) + x.t_b[k] for x in layers)
        opt = sum(x.t_opt for x in layers) / c.p / self._opt_share(c.dp)
        hw = self.job.hardware
        pipeline = max(c.m * sum(time) / c.p + fill_floor(c.family, c.p, layers, k), c.m * self._busiest(c, time))
        return pipeline + opt + hw.step_fixed + hw.step_per_action * actions_floor(c)

    def _busiest(self, c: Config, time: tuple[float, ...]) -> float:
        """``block_split.busiest_floor`` of ``c`` (cached per layer times, p and parameter copies)."""
        fam = FAMILIES.get(c.family)
        key = ("busiest", time, c.p, fam.param_copies if fam else 0)
        if key not in self._partitions:
            self._partitions[key] = busiest_floor(time, c.p, key[3]) if fam else 0.0
        return self._partitions[key]

    def memory_floor(self, c: Config) -> float:
        """A lower bound on the fullest GPU's bytes without the schedule, where the family says how much it
        holds (``Family.holds_all``: every micro-batch of every stage at once): the average of every rank's
        state and its m micro-batches' kept bytes. 0 for the others."""
        fam = FAMILIES.get(c.family)
        if fam is None or not fam.holds_all or self.per_block or self.offload != "none":  # (block by block: less
            return 0.0  # than the layers' state; offloaded: at most two units)
        lc = self._layer_costs(c)
        kept = min(lc.input_bytes) * c.p * c.v if lc.input_bytes else sum(lc.act)  # a recomputed piece: its input
        return (sum(lc.fixed) + c.m * kept) / c.p

    def _opt_share(self, dp: int) -> int:
        """How many replicas split the optimizer step."""
        return 1 if self.sharding == "ddp" else self.parallelism.fsdp if self.sharding == "hsdp" else dp

    def prepare(self, c: Config, counts: tuple[int, ...] | None = None) -> Prepared:
        """Split (``counts``, else the searcher's), memory and lower bound of ``c`` (no simulation)."""
        sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
        prof, cl = self.profile, self.cluster
        counts = counts or self._split(h, c)
        lc = self._layer_costs(c)
        part = evaluate(lc, h, counts, cl.memory)
        replay = self.replay.get(c.mbs, 0.0)
        sharded = self.sharding in ("fsdp", "hsdp")
        # the stages gathered whole (none unless sharded)
        gathered = rank_fixed_bytes(prof, counts, h, gathered_factor(self.sharding)) if sharded else [0.0] * h.ranks
        unheld = [0.0] * h.ranks  # what a block-by-block rhythm never holds at once
        if self.per_block and sharded:
            whole, gathered = gathered, self._gathered(counts, h, c)
            unheld = [w - g for w, g in zip(whole, gathered)]
        rank_memory = [x - u for x, u in zip(part.rank_memory, unheld)]
        if max(rank_memory) + replay > cl.memory * (1 + 1e-9):  # too big: the partition's own memory says so
            return Prepared(config=c, counts=counts, memory=tuple(x + replay for x in rank_memory),
                            activations=(), fits=False, bound=float("inf"), step_end=0.0, optimizer=0.0,
                            costs=None)
        costs = stage_costs(prof, counts, h, c.mbs, c.recompute, cl, c.p, c.dp)
        resolved = costs.resolve(sched.stages)
        acts = peak_activation_bytes(h, resolved.activation_bytes)
        fixed = [f - u for f, u in zip(rank_fixed_bytes(prof, counts, h, cl.state_factor, cl), unheld)]
        transient = rank_transient_bytes(prof, counts, h, c.mbs, c.recompute)
        memory = tuple(f + a + x + replay for f, a, x in zip(fixed, acts, transient))
        r = max(range(h.ranks), key=memory.__getitem__)
        parts = MemoryParts(state=fixed[r] - gathered[r], gathered=gathered[r], activations=acts[r],
                            transient=transient[r] + replay)
        opt = max(rank_optimizer_time(prof, counts, h)) / self._opt_share(c.dp)
        end = step_sync_time(prof, counts, h, cl, c.p, c.dp) + opt
        hw, offloaded = self.job.hardware, 0.0
        if self.offload == "all":  # the host link's time that the rank's compute does not hide; the host's memory
            kept, offloads = self._kept(c, sched)
            end += offload_exposure(h, offloads, resolved, c.m, hw.host_bandwidth)
            offloaded = offloaded_bytes(kept, h, resolved.activation_bytes)
        host_fits = hw.host_memory is None or offloaded * hw.gpus_per_node <= hw.host_memory
        split = FAMILIES[c.family].split_backward if c.family in FAMILIES else True
        fill = pipeline_bound(sched, resolved, split, c.m)  # a long step's stand-in scaled to m (``_play``)
        if self.long_step(c):
            fill *= 1 - _ROUNDING
        over = self.job.hardware.step_overhead(max(len(prog) for prog in sched.programs) * _steps(self.long_step(c), c.m))
        bound = max(c.m * part.bottleneck, fill) + end + over
        return Prepared(config=c, counts=counts, memory=memory, activations=acts,
                        fits=max(memory) <= cl.memory * (1 + 1e-9) and host_fits, bound=max(bound, self.floor(c)),
                        step_end=end, optimizer=opt, costs=costs, free=counts == self._free_split(h, c), parts=parts,
                        gathered=tuple(gathered), offloaded=offloaded)

    def _gathered(self, counts, h, c: Config) -> list[float]:
        """Per rank, the bytes its sharded stages hold only while gathered (``held_gathered``)."""
        held = [held_gathered(layers, per_block=self.per_block)
                for layers in piece_layer_bytes(self.profile, counts)]
        return [sum(held[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)]

    def _layer_costs(self, c: Config) -> LayerCosts:
        """``layer_costs`` at ``c``'s micro-batch size and recomputation (cached: the profile and the cluster
        are this searcher's)."""
        key = ("layer costs", c.mbs, c.recompute)
        if key not in self._partitions:
            self._partitions[key] = layer_costs(self.profile, c.mbs, c.recompute, self.cluster.state_factor,
                                                self.cluster)
        return self._partitions[key]

    def _free_split(self, h, c: Config) -> tuple[int, ...] | None:
        """The block water-fill without a memory limit (cached per holding), where it applies."""
        key = ("free", h, c.mbs, c.recompute)
        if key not in self._partitions:
            lc = self._layer_costs(c)
            self._partitions[key] = block_split(lc, h, None) if is_block_model(lc) else None
        return self._partitions[key]

    @property
    def gather_scale(self) -> float:
        """Bytes all-gathered per bf16 weight byte (halved with FP8 weights)."""
        return self.job.gather_scale

    def _gather(self, c: Config, counts, h, fixed: list[float]) -> float:
        """ZeRO-1's all-gather of the updated weights: the dense ones over dp, the routed experts' over their
        replicas (on their own link)."""
        cl, g = self.cluster, self.gather_scale
        dense, routed = _rank_weights(self.profile, counts, h)
        return max(reduce_scatter_time(d * g, c.dp, cl.data_parallel_link(c.p, c.dp))
                   + (reduce_scatter_time(e * g, cl.replicas, cl.expert_data_parallel_link(c.p, c.dp)) if e else 0.0)
                   for d, e in zip(dense, routed))

    def _reduction_bytes(self, counts) -> list[list[float]]:
        """Per piece, the bytes of each layer that reduce over dp in the time its gradients take: the routed
        experts' go over their replicas on their own link, so they count at the ratio of the two per-byte times
        (a dense layer's are its parameter bytes)."""
        cl, (p, dp) = self.cluster, self.cluster.layouts()[0]
        ratio = 1.0
        if self.experts:
            ratio = _per_byte(cl.replicas, cl.expert_data_parallel_link(p, dp)) / (
                _per_byte(dp, cl.data_parallel_link(p, dp)) or 1.0)
        bounds = [0, *accumulate(counts)]
        return [[x.param_bytes - x.expert_param_bytes * (1 - ratio) for x in self.profile.layers[lo:hi]]
                for lo, hi in zip(bounds, bounds[1:])]

    @property
    def experts(self) -> bool:
        """Whether some layer holds routed experts (a mixture of experts)."""
        return any(x.expert_param_bytes for x in self.profile.layers)

    def _split(self, h, c: Config) -> tuple[int, ...]:
        """The block water-fill (cached per holding): on the real layers where the blocks are identical, at the
        blocks' mean time for a mixture of experts whose blocks differ; else the exact partitioner."""
        if self.space.split == "even":  # the configurations it cannot split were never offered
            return self._even(h.pieces)
        lc = self._layer_costs(c)
        key = ("blocks", h, c.mbs, c.recompute)
        if key not in self._partitions:
            room = self.cluster.memory - self.replay.get(c.mbs, 0.0)  # leave room for the block being replayed
            counts = None
            if is_block_model(lc) or self.experts:
                fill = lc if is_block_model(lc) else _alike(lc)
                # none fits: the fastest (the cached water-fill without a limit, on the real layers)
                counts = block_split(fill, h, room) or (self._free_split(h, c) if fill is lc else
                                                        block_split(fill, h, None))
            self._partitions[key] = counts
        counts = self._partitions[key]
        return counts if counts is not None else self._partition(h, c).counts

    def _tie(self, h, c: Config, counts: tuple[int, ...]) -> tuple[int, ...] | None:
        """The block split with ties in load given to later ranks and pieces (``block_split(later=True)``): as
        balanced, within the same limit, where a rank holds several pieces (not DualPipe's shared ones); None
        where there is no other. Which piece takes a block changes the schedule's fill and drain, not the load."""
        if h.one_stage_per_rank or len(h.stage_piece) != h.pieces or self.space.split == "even":
            return None
        key = ("tie", h, c.mbs, c.recompute, counts)
        if key not in self._partitions:
            lc = self._layer_costs(c)
            alt = None
            if is_block_model(lc) or self.experts:
                fill = lc if is_block_model(lc) else _alike(lc)
                room = self.cluster.memory - self.replay.get(c.mbs, 0.0)
                alt = block_split(fill, h, room, later=True) or block_split(fill, h, None, later=True)
                if alt == counts or alt is not None and evaluate(fill, h, alt).bottleneck > \
                        evaluate(fill, h, counts).bottleneck * (1 + 1e-9):
                    alt = None
            self._partitions[key] = alt
        return self._partitions[key]

    def _played_faster(self, pre: Prepared) -> Prepared:
        """``pre``, or its configuration with the tie split (``_tie``) where that fits and the schedule plays it
        faster (once per configuration, for those simulated; the bound stays the block split's)."""
        c = pre.config
        key = ("played", c)
        if key not in self._partitions:
            sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
            alt = self._tie(h, c, pre.counts) if pre.fits else None
            other = self.prepare(c, alt) if alt is not None else None
            if other is not None and other.fits:
                mine, theirs = self._play(c, sched, pre.costs), self._play(c, sched, other.costs)
                if theirs[1] < mine[1]:
                    pre = other
                self._timelines[(c, False)] = theirs if pre is other else mine
            self._partitions[key] = pre
        return self._partitions[key]

    def finish(self, pre: Prepared, fw: Framework | None = None) -> "ClusterCandidate":
        """Simulate a prepared configuration and add the data-parallel traffic as ``fw``'s rules say (the
        first of ``frameworks`` by default)."""
        fw = fw or self.frameworks[0]
        pre = self._played_faster(pre)
        c = pre.config
        sched, h = self._schedules[(c.family, c.p, c.m, c.v)]
        prof, cl, hw = self.profile, self.cluster, self.job.hardware
        key = (c, fw.blocks_p2p(c.v))
        if key not in self._timelines:
            costs = blocking_p2p(pre.costs, h) if fw.blocks_p2p(c.v) else pre.costs
            self._timelines[key] = self._play(c, sched, costs)
        tl, makespan, bubble, _ = self._timelines[key]
        layer_bytes = self._reduction_bytes(pre.counts)
        exposed, gather = self._traffic(tl, layer_bytes, h, pre, fw)
        over = hw.step_overhead(max(len(prog) for prog in sched.programs) * _steps(self.long_step(c), c.m))
        step = makespan + exposed + gather + pre.step_end + over
        tokens = self.sequences * self.job.spec.seq
        cand = Candidate(config=c, counts=pre.counts, layout=format_layout(prof.symbols, pre.counts),
                         step_time=step, makespan=makespan,
                         allreduce=step - makespan - pre.optimizer - over, optimizer=pre.optimizer, overhead=over,
                         throughput=self.sequences / step, bubble=bubble, memory=pre.memory,
                         activations=pre.activations, fits=pre.fits, schedule=sched)
        mfu = self.job.spec.model_flops_per_token() * tokens / (step * self.job.gpus * hw.peak_flops)
        long = self.long_step(c)
        layout = dict(ep_nodes=cl.nodes(), expert_placement=cl.placement) if self.job.spec.moe is not None else {}
        return ClusterCandidate(parallelism=self.parallelism, candidate=cand, exposed_dp=exposed, mfu=mfu,
                                tokens_per_second=tokens / step, recompute=self.recompute, framework=fw.name,
                                sharding=self.sharding, exposed_gather=gather,
                                usable=cl.memory, band=hw.band, costed_from=long[0] if long else None,
                                memory_band=hw.memory_band, memory_parts=pre.parts,
                                fragmentation=self.job.memory_reserve.fragmentation * hw.memory,
                                slices=self.slices, offload=self.offload, offloaded=pre.offloaded, **layout)

    def lowered(self, got: ClusterCandidate, pre: Prepared, fw: Framework) -> ClusterCandidate:
        """``got`` (``finish``'s) with its step from playing the lowered program under ``fw``'s rules
        (``lowered``: the same compute, the data-parallel traffic as actions on the layout's links)."""
        pre = self._played_faster(pre)  # the split ``finish`` played
        c = pre.config
        h = self._schedules[(c.family, c.p, c.m, c.v)][1]
        _, makespan, _, (sched, span) = self._timelines[(c, fw.blocks_p2p(c.v))]
        par = got.parallelism
        if par.dp * par.fsdp * par.ep == 1 and len(sched.lanes) == 1:  # nothing to reduce, gather or sum: the
            return replace(got, lowered=True)  # sends carry the cost model's time alone, as the compute's play
        layers = self._reduction_bytes(pre.counts)
        comm = communication(par, [layers[piece] for piece in h.stage_piece], self.gather_scale, fw, self.cluster)
        costs = blocking_p2p(pre.costs, h) if fw.blocks_p2p(c.v) else pre.costs
        low = comm.lower(sched)
        extra, gather = exposure(low, costs, span)
        step = makespan + extra + pre.step_end + got.candidate.overhead
        memory, parts = held_memory(low, pre, h, self.profile, self.cluster, self.sharding) \
            if self.sharding in ("fsdp", "hsdp") else (pre.memory, pre.parts)
        cand = replace(got.candidate, step_time=step, allreduce=step - makespan - pre.optimizer - got.candidate.overhead,
                       throughput=self.sequences / step, memory=memory)
        scale = got.step_time / step
        return replace(got, candidate=cand, exposed_dp=extra - gather, exposed_gather=gather, mfu=got.mfu * scale,
                       tokens_per_second=got.tokens_per_second * scale, lowered=True, memory_parts=parts)

    def _play(self, c: Config, sched, costs) -> tuple:
        """(timeline, makespan, bubble, (the schedule whose lowered program ``lowered`` plays, its compute
        span)) of ``c``: simulated, or for a long step extended from its shorter ones (``steady``; the timeline
        is the ``2 mc`` one, whose start and end the traffic rules read; the ``mc`` one is lowered)."""
        tl = simulate(sched, costs, check=False)
        span, bubble = timing(tl)
        long = self.long_step(c)
        if long is None:
            return tl, span, bubble, (sched, span)
        mc, short = long
        span1, bubble1 = timing(simulate(short, costs, check=False))
        ranks = sched.ranks
        makespan, busy = extend((span1, (1 - bubble1) * ranks * span1), (span, (1 - bubble) * ranks * span), mc, c.m)
        # no schedule of m beats its pipeline bound: the extension is kept above it (less the rounding of two
        # sums of one value), so ``prepare``'s bound, the same one, stays a bound
        split = FAMILIES[c.family].split_backward
        makespan = max(makespan, pipeline_bound(sched, costs.resolve(sched.stages), split, c.m) * (1 - _ROUNDING))
        return tl, makespan, 1 - busy / (ranks * makespan), (short, span1)

    def _traffic(self, tl, layer_bytes, h, pre: Prepared, fw: Framework) -> tuple[float, float]:
        """(exposed gradient reduction, exposed weight gathers) of a timeline under ``fw``'s rules."""
        c, cl, mode = pre.config, self.cluster, self.sharding
        link = cl.data_parallel_link(c.p, c.dp)
        group = self.parallelism.fsdp if mode == "hsdp" else c.dp  # HSDP's shard group
        shard_link = cl.data_parallel_link(c.p, group)
        cost = reduction_cost(mode, c.dp, group, shard_link if mode == "hsdp" else link, cl.inter)
        sharded = mode in ("fsdp", "hsdp")
        rule = overlap(fw, self.per_block).fsdp_reduce if sharded else fw.overlap.reduce
        exposed = exposed_reduction(tl, layer_bytes, h.stage_piece, c.dp, link, rule=rule, cost=cost)
        if mode == "ddp" or group == 1:
            return exposed, 0.0
        unit = fw.overlap.fsdp_gather if sharded else fw.overlap.gather
        if unit == "end":  # after the optimizer step: the rank's whole shard, exposed
            fixed = rank_fixed_bytes(self.profile, pre.counts, h, cl.state_factor, cl)
            return exposed, self._gather(c, pre.counts, h, fixed)
        g = self.gather_scale
        return exposed, exposed_gather(tl, layer_bytes, h.stage_piece, unit,
                                       lambda nbytes: reduce_scatter_time(nbytes * g, group, shard_link),
                                       per_block=sharded and self.per_block)


#: relative slack of a long step's pipeline bound: the extension of an exact family equals it up to rounding
_ROUNDING = 1e-9


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


def pipeline_bound(sched, sc, split_backward: bool, m: int | None = None) -> float:
    """A lower bound on the makespan, per rank: its earliest start + its work + its latest drain.

    A rank's first op is a forward, which waits for the forwards of the stages before it in its lane
    (one micro-batch's chain); its last op, without a split backward, is a backward, after which the
    backwards of the stages before it must run. Links only add to both, so the bound holds for any order.
    ``m`` (default the schedule's) scales the lanes' micro-batches: a long step's stand-in bounds the step.
    """
    if sc.fb is not None:  # an overlapped pair may cost less than its halves: no per-op sum is safe
        return 0.0
    scale = 1 if m is None else m / sched.microbatches
    before_f, before_b = [0.0] * sched.stages, [0.0] * sched.stages
    share = [0] * sched.stages
    for lane in sched.lanes:
        f = b = 0.0
        for st in lane.stages:
            before_f[st], before_b[st], share[st] = f, b, (lane.mb_hi - lane.mb_lo) * scale
            f, b = f + sc.f[st], b + sc.b[st]
    best = 0.0
    for r in range(sched.ranks):
        stages = sched.stages_of_rank(r)
        back = [sc.i[st] + sc.w[st] if split_backward else sc.b[st] for st in stages]
        work = sum(share[st] * (sc.f[st] + bk) for st, bk in zip(stages, back))
        drain = 0.0 if split_backward else min(before_b[st] for st in stages)
        best = max(best, min(before_f[st] for st in stages) + work + drain)
    return best


def _rank_weights(prof, counts, h) -> tuple[list[float], list[float]]:
    """Per rank, bf16 bytes of dense and of routed-expert weights (over every piece copy it holds)."""
    bounds = [0, *accumulate(counts)]
    pieces = [prof.layers[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    dense = [sum(x.param_bytes - x.expert_param_bytes for x in layers) for layers in pieces]
    routed = [sum(x.expert_param_bytes for x in layers) for layers in pieces]
    return ([sum(dense[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)],
            [sum(routed[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)])


def _alike(lc: LayerCosts) -> LayerCosts:
    """``lc`` with every block's time (all but the first and last layer's) at the blocks' mean."""
    blocks = lc.time[1:-1]
    mean = sum(blocks) / len(blocks)
    return replace(lc, time=(lc.time[0],) + (mean,) * len(blocks) + (lc.time[-1],))


def _per_byte(group: int, link) -> float:
    """Seconds a ring reduce-scatter spends per byte among ``group``."""
    return (group - 1) / group / link.bandwidth if group > 1 else 0.0
