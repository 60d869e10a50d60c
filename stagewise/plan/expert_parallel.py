"""Expert parallelism at cluster scale: where an MoE model's expert groups land, and (ep, etp, placement)
as search dimensions.

MoE parallel folding (Megatron-Core, arXiv:2504.14960): attention is cut t ways over a stage's t x dp GPUs
as ever, while the MoE layers have a layout of their own over the same GPUs, expert tensor parallel
``etp`` innermost, then expert parallel ``ep``, then the expert data-parallel replicas (``edp``):
``etp x ep x edp = t x dp``. Each GPU holds ``experts / ep`` routed experts of every MoE block, cut ``etp``
ways; Megatron-LM's traditional layout is etp = t (the experts split as attention is), folding lets
``--expert-tensor 1 --tensor 2 --expert 8`` keep EP 8 inside one 8-GPU node.

Placement (``PLACEMENTS``) is the device order: "within" is Megatron-Core's default (tensor, expert, data,
pipeline: the pipeline outermost), so an expert group is ``ep x etp`` consecutive GPUs, one node when it
fits, and pipeline neighbours sit ``t x dp`` GPUs apart; "across" puts the pipeline inside (tensor,
pipeline, data: ``--use-tp-pp-dp-mapping``), so a pipeline's stages share a node and an expert group's
members sit ``t x p`` GPUs apart, on other nodes. The search may try both.

What the expert layout changes, beside the all-to-all (``analytic.expert_a2a_time``, over the nodes a
group spans): weights (routed experts / ep / etp), ZeRO-1's optimizer state of the routed experts (sharded
over the edp replicas, ``Cluster.expert_state_factor``) and their gradient reduction and weight all-gather
(over those replicas, on their own link).

The split: a model whose first blocks are dense (DeepSeek-V3's 3) is not one of identical blocks, and the
exact partitioner takes seconds per holding at p = 16 (a HiGHS program for DualPipe's shared pieces), 25x
the whole search otherwise. Its blocks are split by ``block_split``'s water-fill with every block's time
at the blocks' mean (dense and MoE blocks cost within a few per cent of each other there) and memory
checked on the real layers; the configuration is then measured with its real costs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import accumulate

from ..parallelism import Parallelism
from .analytic import ExpertParallel, TensorParallel, analytic_profile, replay_bytes
from .block_split import block_split
from .cluster_job import Job, state_factor
from .cluster_search import ClusterCandidate, ClusterSearcher, Prepared, _OnePipeline, dp_link
from .data_parallel import reduce_scatter_time
from .model import layer_costs
from .partition import LayerCosts
from .profile import Link, Profile
from .search import Config

#: device orders an expert-parallel layout may take (see the module doc)
PLACEMENTS = ("within", "across")


def expert_degrees(job: Job, pool: int, t: int) -> list[tuple[int, int]]:
    """(ep, etp) tried on a stage's ``pool`` = t x dp GPUs: ``job.expert`` (or every divisor of the experts)
    with ``job.expert_tensor`` (or etp = t and 1), ep x etp dividing the pool and a multiple of t (so the
    layout is a ``Parallelism``: ep x etp / t data ranks share each block's experts)."""
    experts = job.spec.moe.experts
    # bounded by the GPUs (an MoE file's experts are bounded by STAGEWISE_MAX_EXPERTS, not their divisors)
    eps = job.expert or tuple(e for e in range(1, pool + 1) if pool % e == 0 and experts % e == 0)
    etps = job.expert_tensor or tuple(dict.fromkeys((t, 1)))
    return [(e, x) for e in eps for x in etps
            if experts % e == 0 and pool % (e * x) == 0 and (e * x) % t == 0 and (x % t == 0 or t % x == 0)]


@lru_cache(maxsize=65536)
def _nodes(node: int, p: int, pool: int, t: int, placement: str, stride: int, count: int) -> int:
    """Most nodes one set of pool positions ``o + i * stride`` (i < count) spans, over every pipeline rank and
    every such set (the sets partition the pool: offsets o with ``(o // stride) % count == 0``)."""
    worst = 1
    for r in range(p):
        for o in range(pool):
            if (o // stride) % count == 0:
                nodes = {_gpu(placement, p, pool, t, r, o + i * stride) // node for i in range(count)}
                worst = max(worst, len(nodes))
    return worst


def _gpu(placement: str, p: int, pool: int, t: int, r: int, q: int) -> int:
    if placement == "within":  # pipeline outermost: rank r's pool is a block of consecutive GPUs
        return r * pool + q
    d, j = divmod(q, t)  # the pipeline inside the data replicas
    return (d * p + r) * t + j


def group_nodes(node: int, p: int, pool: int, t: int, group: int, placement: str = "within") -> int:
    """Most nodes one expert group (``group`` = ep x etp consecutive pool positions) spans."""
    return _nodes(node, p, pool, t, placement, 1, group)


@lru_cache(maxsize=65536)
def _pipeline_crosses(node: int, p: int, pool: int, t: int, placement: str, a: int, b: int) -> bool:
    return any(_gpu(placement, p, pool, t, a, q) // node != _gpu(placement, p, pool, t, b, q) // node
               for q in range(pool))


@dataclass(frozen=True, kw_only=True)
class ExpertPipeline(_OnePipeline):
    """A Cluster searched at one pipeline degree and one expert layout, its devices ordered by ``placement``
    (the links below follow from it; ``per_node`` counts t-groups, ``node`` GPUs)."""

    ep: int = 1
    etp: int = 1
    t: int = 1
    node: int = 8  #: GPUs per node
    placement: str = "within"

    @property
    def pool(self) -> int:
        """GPUs at one pipeline position: t x dp."""
        return self.devices // self.pipeline * self.t

    @property
    def group(self) -> int:
        return self.ep * self.etp

    @property
    def replicas(self) -> int:
        """Expert data parallel: the GPUs of a stage holding the same expert shard."""
        return self.pool // self.group

    def nodes(self) -> int:
        """Most nodes one expert group spans."""
        return group_nodes(self.node, self.pipeline, self.pool, self.t, self.group, self.placement)

    def link(self, p: int, dp: int, a: int, b: int) -> Link:
        """Pipeline ranks a and b of one replica."""
        return self.inter if _pipeline_crosses(self.node, p, self.pool, self.t, self.placement, a, b) else self.intra

    def data_parallel_link(self, p: int, dp: int) -> Link:
        """A stage's dp replicas of one tensor-parallel rank: pool positions t apart."""
        crosses = dp > 1 and _nodes(self.node, p, self.pool, self.t, self.placement, self.t, dp) > 1
        return self.inter if crosses else self.intra

    def expert_data_parallel_link(self, p: int, dp: int) -> Link:
        """The replicas that hold the same expert shard: pool positions ep x etp apart."""
        n = self.replicas
        crosses = n > 1 and _nodes(self.node, p, self.pool, self.t, self.placement, self.group, n) > 1
        return self.inter if crosses else self.intra


@dataclass(kw_only=True)
class MoESearcher(ClusterSearcher):
    """A ClusterSearcher at one expert layout: the routed experts' gradients and weights travel over their
    own replicas."""

    def finish(self, pre: Prepared, fw=None) -> ClusterCandidate:
        c = self.cluster
        return replace(super().finish(pre, fw), ep=self.ep, etp=c.etp, ep_nodes=c.nodes(),
                       expert_placement=c.placement)

    def _split(self, h, c: Config) -> tuple[int, ...]:
        """The block water-fill, every block at the blocks' mean time, memory on the real layers."""
        key = ("moe-blocks", h, c.mbs, c.recompute)
        if key not in self._partitions:
            lc = _alike(layer_costs(self.profile, c.mbs, c.recompute, self.cluster.state_factor, self.cluster))
            room = self.cluster.memory - self.replay.get(c.mbs, 0.0)
            self._partitions[key] = block_split(lc, h, room) or block_split(lc, h, None)
        return self._partitions[key]

    def _gather(self, c: Config, counts, h, fixed: list[float]) -> float:
        """ZeRO-1's weight all-gather: the dense weights over dp, the routed experts' over their replicas."""
        cl = self.cluster
        dense, routed = _rank_weights(self.profile, counts, h)
        g = self.gather_scale
        return max(reduce_scatter_time(d * g, c.dp, dp_link(cl, c.p, c.dp))
                   + reduce_scatter_time(e * g, cl.replicas, cl.expert_data_parallel_link(c.p, c.dp))
                   for d, e in zip(dense, routed))

    def _reduction_bytes(self, counts) -> list[list[float]]:
        """Per layer, the bytes that reduce over dp in the time its gradients take: the routed experts'
        go over their replicas on their own link, so they count at the ratio of the two per-byte times."""
        cl, p, dp = self.cluster, self.cluster.pipeline, self.cluster.devices // self.cluster.pipeline
        ratio = _per_byte(cl.replicas, cl.expert_data_parallel_link(p, dp)) / (_per_byte(dp, dp_link(cl, p, dp))
                                                                            or 1.0)
        bounds = [0, *accumulate(counts)]
        return [[x.param_bytes - x.expert_param_bytes * (1 - ratio) for x in self.profile.layers[lo:hi]]
                for lo, hi in zip(bounds, bounds[1:])]


def _alike(lc: LayerCosts) -> LayerCosts:
    """``lc`` with every block's time (all but the first and last layer's) at the blocks' mean."""
    blocks = lc.time[1:-1]
    mean = sum(blocks) / len(blocks)
    return replace(lc, time=(lc.time[0],) + (mean,) * len(blocks) + (lc.time[-1],))


def _per_byte(group: int, link: Link) -> float:
    """Seconds a ring reduce-scatter spends per byte among ``group``."""
    return (group - 1) / group / link.bandwidth if group > 1 else 0.0


def _rank_weights(profile: Profile, counts, h) -> tuple[list[float], list[float]]:
    """Per rank, bf16 bytes of dense and of routed-expert weights (over every piece copy it holds)."""
    bounds = [0, *accumulate(counts)]
    pieces = [profile.layers[lo:hi] for lo, hi in zip(bounds, bounds[1:])]
    dense = [sum(x.param_bytes - x.expert_param_bytes for x in layers) for layers in pieces]
    routed = [sum(x.expert_param_bytes for x in layers) for layers in pieces]
    return ([sum(dense[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)],
            [sum(routed[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)])


def expert_state_factor(replicas: int, zero: bool) -> float:
    """Bytes per bf16 routed-expert parameter byte: ZeRO-1 shards its optimizer state over the ``replicas``
    that hold it (expert data parallel)."""
    return state_factor(replicas, zero)


def moe_pipelines(job: Job, t: int, tp: TensorParallel, mode: str, shared: dict, skipped: dict) -> list[MoESearcher]:
    """One searcher per (p, ep, etp, placement) and sharding at tensor degree ``t`` and recomputation
    ``mode``: the analytic profile at that expert layout and the nodes its group spans, the cluster in that
    device order. Under ZeRO-1 and FSDP the routed experts' state is sharded over their replicas (HSDP is
    not searched for MoE models)."""
    from .cluster_search import _families, _runners, offered, recompute_modes
    from .cluster_job import shardings

    hw, spec = job.hardware, job.spec
    modes = [sh for sh in dict.fromkeys(x for fw in _runners(job, mode) for x in shardings(job, fw)) if sh != "hsdp"]
    ranks = job.gpus // t
    per_node = max(1, hw.gpus_per_node // t)
    profiles: dict[tuple, Profile] = {}
    replay = {b: replay_bytes(spec, b, tp, linear_factor=job.linear_factor)
              for b in job.micro_batch_sizes} if mode == "full" else {}
    out = []
    for p in job.pipeline or [p for p in range(1, ranks + 1) if ranks % p == 0]:
        if ranks % p or p > spec.layers + 2:
            continue
        dp = ranks // p
        for ep, etp in expert_degrees(job, dp * t, t):
            for place in job.expert_placement if p > 1 else job.expert_placement[:1]:
                cl0 = ExpertPipeline(devices=ranks, per_node=per_node, memory=job.usable, intra=hw.intra,
                                     inter=hw.inter, pipeline=p, ep=ep, etp=etp, t=t, node=hw.gpus_per_node,
                                     placement=place)
                key = (ep, etp, cl0.nodes())
                if key not in profiles:
                    profiles[key] = analytic_profile(spec, hw, tp, job.micro_batch_sizes, recompute=mode,
                                                     expert=ExpertParallel(ep=ep, nodes=key[2], zero=job.zero, etp=etp),
                                                     compute=job.compute)
                prof = profiles[key]
                for sharding in modes:
                    par = Parallelism.of_plan(p=p, dp=dp, t=t, sharding=sharding, ep=ep, etp=etp)
                    runners = offered(tuple(fw for fw in _runners(job, mode, sharding) if place in fw.expert_placements),
                                      par, skipped)
                    families = _families(job, runners, skipped)
                    if not families:
                        continue
                    sf = state_factor(dp, sharding=sharding) + job.weight_extra
                    esf = state_factor(cl0.replicas, sharding=sharding) + job.weight_extra
                    weights = sum(x.param_bytes * sf + x.expert_param_bytes * (esf - sf) for x in prof.layers)
                    if weights / p > job.usable:
                        why = "weights, gradients and optimizer state alone exceed the GPU's usable memory"
                        if mode == recompute_modes(job)[0]:
                            skipped[why] = skipped.get(why, 0) + 1
                        continue
                    cl = replace(cl0, state_factor=sf, expert_state_factor=esf)
                    out.append(MoESearcher(profile=prof, cluster=cl, global_batch=job.global_batch, job=job, t=t,
                                           ep=ep, space=replace(job.space, families=families, recompute=(False,)),
                                           recompute=mode, replay=replay, sharding=sharding, frameworks=runners,
                                           _schedules=shared, skipped=skipped))
    return out
