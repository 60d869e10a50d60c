"""Search at cluster scale: tensor x pipeline x data parallel, expert layout, family, v, micro-batch size,
recomputation, split.

For each tensor-parallel degree t the model gets an analytic profile (one GPU of a t-group); the rest is the
ordinary search: the same schedules, a split of identical blocks (``block_split``: the first and last stage get
fewer blocks when the embedding, the head or the warm-up activations make them heavier) and the one simulator.
Recomputation (off, selective, full) is the analytic profile's: full checkpoints each block, as Megatron-LM and
torchtitan do, so the generic ``Config.recompute`` (a whole stage replayed, the runtime's way) stays off here
(stagewise's own runtime replays a whole stage: its "stage" mode is that generic recomputation). The layouts
are ``layouts.searchers``' (a dense model's and a mixture of experts' alike), each searcher's the cluster around
its pipeline (``searcher``); the job and its rules are in ``job``.

The search is best-first and exact for the top K (and for each framework's best): every configuration gets a
schedule-free lower bound first (its ranks' share of the work at perfect balance, their fill and drain, the
optimizer step, the per-action overhead), and only those whose bound can still reach the top have their
schedule built and their split, memory and tighter bound prepared; only prepared ones that fit and can still
reach the top are simulated.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ...collector import gc_paused
from ..errors import PlanError
from ..search import Config
from .candidate import ClusterCandidate
from .job import Job, _nothing_to_search, check_job, state_factor
from .layouts import searchers, unrun
from .searcher import ClusterSearcher, Prepared

#: families that run another's stages and work with less memory and more bubble (the controllable-memory
#: building blocks of ZB-V: bubble 0, B/2, 2B/3 of 1F1B's at equal costs); searched only where that family
#: does not fit with its fastest split (tests/test_plan_cluster_search.py checks they are never faster)
TRADES_BUBBLE_FOR_MEMORY = {"v-half": ("zb-v",), "v-min": ("zb-v", "v-half")}
#: recomputation modes by how much they save (the search keeps the least that fits); "stage" is the
#: stagewise runtime's whole-stage replay, which keeps less than block-by-block "full"
_LEVEL = {"off": 0, "selective": 1, "full": 2, "stage": 3}


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
    #: of ``simulated`` (for each framework that runs it), how many had their lowered program played: the rest
    #: could not reach the top even with their communication free
    lowered: int = 0


def cluster_search(job: Job, progress: Callable[[int, int], None] | None = None, keep: int = 10,
                   per_layout: bool = False, schedules: dict | None = None, floors: bool = True,
                   lowered: bool = True) -> Result:
    """The ``keep`` fastest configurations that fit, exactly, and each framework's fastest: best-first by
    lower bound, a configuration's schedule is built only while its schedule-free bound
    (``ClusterSearcher.floor``) can reach the top, and it is simulated only while its prepared bound
    (``Prepared.bound``) can (with ``per_layout``, also each t x p grid's best is exact). ``floors`` False
    builds and prepares every configuration before simulating any (benchmarks/bench_cluster_plan.py's baseline).
    Each step reported is the lowered program's (``ClusterSearcher.lowered``); ``lowered`` False keeps the
    O(stages) traffic rules' steps, the bound the search lowers by (benchmarks/bench_cluster_plan.py compares)."""
    check_job(job)
    with gc_paused():  # thousands of schedules and no cycles: the collector's rescans cost a quarter of the search
        return _search(job, progress, keep, per_layout, schedules, floors, lowered)


def _search(job: Job, progress, keep: int, per_layout: bool, schedules: dict | None, floors: bool,
            lowered: bool) -> Result:
    skipped: dict = {}
    found = searchers(job, skipped, schedules)
    if not found:
        raise PlanError(unrun(job) or _nothing_offered(job, skipped) or _weights_do_not_fit(job))
    work = [(s, c) for s in found for c in s.configs(build=False)]
    if not work:
        raise PlanError(_nothing_to_search(job, skipped))
    search = _BestFirst(keep=keep, per_layout=per_layout, floors=floors, lowered=lowered)
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
    return Result(ranking=out, configurations=len(work), simulated=counts["simulated"], lowered=counts["lowered"],
                  pruned=pruned,
                  too_big=counts["too_big"], unbuilt=counts["unbuilt"], dominated=counts["dominated"], best=best,
                  not_offered={k: n for k, n in skipped.items() if k.startswith("not offered for ")})


@dataclass(kw_only=True)
class _BestFirst:
    """The lazy, exact search: mutable only for its running bests."""

    keep: int
    per_layout: bool
    floors: bool = True  #: prune by the schedule-free bound (False: build every configuration's schedule first)
    #: each step from the lowered program (``ClusterSearcher.lowered``); False: the O(stages) traffic rules'
    lowered: bool = True
    best: list = field(default_factory=list)  # a max-heap (negated) of the keep fastest steps so far
    by_framework: dict = field(default_factory=dict)  # framework -> its fastest step so far
    by_grid: dict = field(default_factory=dict)  # (t, p) -> its fastest step so far

    def useless(self, bound: float, s: ClusterSearcher, family: str, p: int, fw=None) -> bool:
        """Whether nothing with this lower bound can enter the top, a framework's best (``fw``'s only, for a
        configuration costed under it) or (per_layout) its grid's best."""
        if len(self.best) < self.keep or bound <= -self.best[0]:
            return False
        mine = (fw,) if fw is not None else [f for f in s.frameworks if f.runs(family)]
        if any(bound <= self.by_framework.get(f.name, float("inf")) for f in mine):
            return False
        return not self.per_layout or (s.parallelism.tp, p) in self.by_grid and bound > self.by_grid[(s.parallelism.tp, p)]

    def record(self, got: "ClusterCandidate") -> None:
        heapq.heappush(self.best, -got.step_time)
        if len(self.best) > self.keep:
            heapq.heappop(self.best)
        fw, grid = got.framework, (got.parallelism.tp, got.config.p)
        self.by_framework[fw] = min(self.by_framework.get(fw, float("inf")), got.step_time)
        self.by_grid[grid] = min(self.by_grid.get(grid, float("inf")), got.step_time)

    def run(self, work, progress) -> tuple[list, dict]:
        counts = {"simulated": 0, "lowered": 0, "too_big": 0, "unbuilt": 0, "dominated": 0, "prepared": []}
        # more recomputation only adds work: a configuration is dominated where the same one with less fits
        fits_at: dict = {}  # (t, ep, p, sharding, shard, config without recomputation) -> [(level, frameworks)]
        free_fits: dict = {}  # (searcher, family, p, m, mbs, recompute) -> fits with its fastest split
        heap = [(s.floor(c) if self.floors else -1.0, n, 0, s, c) for n, (s, c) in enumerate(work)]
        heapq.heapify(heap)
        total, done, out = len(work), 0, []
        while heap:
            bound, n, stage, s, item = heapq.heappop(heap)
            c = item if stage == 0 else item.config
            if self.useless(bound, s, c.family, c.p, item.fw if stage >= 2 else None):
                if stage == 0:
                    counts["unbuilt"] += 1
                if stage < 2:  # (a lowered one was counted simulated)
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
                key = (_layout(s), _without_rc(c))
                fits_at.setdefault(key, []).append((_level(s, c), {fw.name for fw in s.frameworks}))
                if pre.free:
                    free_fits[(id(s), c.family, c.p, c.m, c.mbs, c.recompute)] = True
                heapq.heappush(heap, (pre.bound, n, 1, s, pre))
                continue
            if stage >= 2:  # lower it: the step it reports (``lowered``), exact while its bound can reach the top
                pre, fw, got = item
                got = s.lowered(got, pre, fw)
                out.append(got)
                self.record(got)
                counts["lowered"] += 1
                continue
            mine = {fw.name for fw in s.frameworks}
            if any(level < _level(s, c) and mine <= fws
                   for level, fws in fits_at[(_layout(s), _without_rc(c))]):
                counts["dominated"] += 1
                done += 1
                continue
            for j, fw in enumerate(s.frameworks):
                if fw.runs(c.family):
                    got = s.finish(item, fw)
                    if self.lowered:  # compute alone (no transfer shortens it) bounds the lowered step
                        heapq.heappush(heap, (got.step_time - got.exposed_dp - got.exposed_gather, n, 2 + j, s,
                                              _Finished(item, fw, got)))
                    else:
                        out.append(got)
                        self.record(got)
            counts["simulated"] += 1
            done += 1
            if progress:
                progress(done, total)
        return out, counts


class _Finished(NamedTuple):
    """A simulated configuration waiting to be lowered, under one framework."""

    pre: Prepared
    fw: object
    got: ClusterCandidate

    @property
    def config(self) -> Config:
        return self.pre.config


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
    from ..search import fmt_bytes

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


def _layout(s) -> tuple:
    """What a searcher's fits are compared across (its recomputation aside): tp, the experts' spread, sharding."""
    par = s.parallelism
    return par.tp, par.expert_degree, s.sharding, par.fsdp
