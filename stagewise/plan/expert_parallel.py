"""Expert parallelism at cluster scale: where an MoE model's ep groups land, and ep as a search dimension.

The routed experts of a stage are sharded over ``ep`` of its data-parallel peers (ep divides dp, as in
DeepSeek-V3 and Megatron-LM): each GPU holds ``experts / ep`` of every MoE block, and its tokens go to
them and back by all-to-all. Devices are ordered as Megatron-LM orders them for MoE (tensor, expert,
data, pipeline: the pipeline outermost), so pipeline rank r's t-groups are ``r * dp .. r * dp + dp - 1``
and an expert-parallel group is ep consecutive ones: a group of ``ep * t`` GPUs no larger than a node
stays on its NVLink, a larger one spans ``ep * t / gpus_per_node`` nodes (DeepSeek-V3's EP 64: 8 nodes)
and its all-to-all crosses InfiniBand (``analytic.expert_a2a_time``). Pipeline neighbours then sit
``dp * t`` GPUs apart, on different nodes as soon as dp fills one.

What ep changes, beside the all-to-all: weights (routed experts / ep), ZeRO-1's optimizer state of the
routed experts (sharded over the dp / ep peers holding the same experts, ``Cluster.expert_state_factor``)
and their gradient reduction and weight all-gather (over those dp / ep peers, on their own link).

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


def expert_degrees(job: Job, ranks: int) -> list[int]:
    """ep tried: ``job.expert``, or every divisor of the experts that divides the pipeline ranks."""
    experts = job.spec.moe.experts
    cands = job.expert or tuple(e for e in range(1, ranks + 1) if ranks % e == 0)  # bounded by the GPUs
    return [e for e in cands if ranks % e == 0 and experts % e == 0]


@lru_cache(maxsize=4096)
def group_nodes(per_node: int, p: int, dp: int, ep: int) -> int:
    """Most nodes one expert-parallel group spans (t-groups ``r*dp + g*ep .. + ep - 1``, ``per_node`` a node)."""
    return max(len({(r * dp + g * ep + j) // per_node for j in range(ep)})
               for r in range(p) for g in range(dp // ep))


@lru_cache(maxsize=65536)
def _spread(per_node: int, p: int, dp: int, stride: int, count: int) -> bool:
    """Whether ``count`` t-groups ``stride`` apart inside some pipeline rank's block cross a node boundary."""
    return any(len({(r * dp + j + k * stride) // per_node for k in range(count)}) > 1
               for r in range(p) for j in range(stride))


@lru_cache(maxsize=65536)
def _pipeline_crosses(per_node: int, dp: int, a: int, b: int) -> bool:
    return any((a * dp + d) // per_node != (b * dp + d) // per_node for d in range(dp))


@dataclass(frozen=True, kw_only=True)
class ExpertPipeline(_OnePipeline):
    """A Cluster searched at one pipeline degree and one ep, its devices ordered tensor, expert, data,
    pipeline (the links below follow from it; ``per_node`` counts t-groups)."""

    ep: int = 1

    def link(self, p: int, dp: int, a: int, b: int) -> Link:
        """Pipeline ranks a and b of one replica: ``dp`` t-groups apart per rank."""
        return self.inter if _pipeline_crosses(self.per_node, dp, a, b) else self.intra

    def data_parallel_link(self, p: int, dp: int) -> Link:
        """A stage's dp replicas are consecutive t-groups."""
        return self.inter if dp > 1 and _spread(self.per_node, p, dp, 1, dp) else self.intra

    def expert_data_parallel_link(self, p: int, dp: int) -> Link:
        """The dp / ep replicas that hold the same experts: ``ep`` t-groups apart."""
        n = dp // self.ep
        return self.inter if n > 1 and _spread(self.per_node, p, dp, self.ep, n) else self.intra


@dataclass(kw_only=True)
class MoESearcher(ClusterSearcher):
    """A ClusterSearcher at one ep: the routed experts' gradients and weights travel over dp / ep peers."""

    def finish(self, pre: Prepared, fw=None) -> ClusterCandidate:
        c = self.cluster
        return replace(super().finish(pre, fw), ep=self.ep,
                       ep_nodes=group_nodes(c.per_node, c.pipeline, c.devices // c.pipeline, self.ep))

    def _split(self, h, c: Config) -> tuple[int, ...]:
        """The block water-fill, every block at the blocks' mean time, memory on the real layers."""
        key = ("moe-blocks", h, c.mbs, c.recompute)
        if key not in self._partitions:
            lc = _alike(layer_costs(self.profile, c.mbs, c.recompute, self.cluster.state_factor, self.cluster))
            room = self.cluster.memory - self.replay.get(c.mbs, 0.0)
            self._partitions[key] = block_split(lc, h, room) or block_split(lc, h, None)
        return self._partitions[key]

    def _gather(self, c: Config, counts, h, fixed: list[float]) -> float:
        """ZeRO-1's weight all-gather: the dense weights over dp, the routed experts' over dp / ep."""
        cl = self.cluster
        dense, routed = _rank_weights(self.profile, counts, h)
        return max(reduce_scatter_time(d, c.dp, dp_link(cl, c.p, c.dp))
                   + reduce_scatter_time(e, c.dp // self.ep, cl.expert_data_parallel_link(c.p, c.dp))
                   for d, e in zip(dense, routed))

    def _reduction_bytes(self, counts) -> list[list[float]]:
        """Per layer, the bytes that reduce over dp in the time its gradients take: the routed experts'
        go over dp / ep peers on their own link, so they count at the ratio of the two per-byte times."""
        cl, p, dp = self.cluster, self.cluster.pipeline, self.cluster.devices // self.cluster.pipeline
        ratio = _per_byte(dp // self.ep, cl.expert_data_parallel_link(p, dp)) / (_per_byte(dp, dp_link(cl, p, dp))
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


def expert_state_factor(dp: int, ep: int, zero: bool) -> float:
    """Bytes per bf16 routed-expert parameter byte: ZeRO-1 shards its optimizer state over the dp / ep
    replicas that hold it."""
    return state_factor(dp // ep, zero)


def moe_pipelines(job: Job, t: int, tp: TensorParallel, mode: str, shared: dict, skipped: dict) -> list[MoESearcher]:
    """One searcher per (ep, p) and sharding at tensor degree ``t`` and recomputation ``mode``: the analytic
    profile at that ep and the nodes its group spans, the cluster in the MoE device order. Under ZeRO-1 and
    FSDP the routed experts' state is sharded over the dp / ep peers that hold the same experts (HSDP is
    not searched for MoE models)."""
    from .cluster_search import _families, _runners, offered, recompute_modes
    from .cluster_job import shardings

    hw, spec = job.hardware, job.spec
    modes = [sh for sh in dict.fromkeys(x for fw in _runners(job, mode) for x in shardings(job, fw)) if sh != "hsdp"]
    ranks = job.gpus // t
    per_node = max(1, hw.gpus_per_node // t)
    profiles: dict[tuple[int, int], Profile] = {}
    replay = {b: replay_bytes(spec, b, tp) for b in job.micro_batch_sizes} if mode == "full" else {}
    out = []
    for ep in expert_degrees(job, ranks):
        for p in job.pipeline or [p for p in range(1, ranks + 1) if ranks % p == 0]:
            if ranks % p or p > spec.layers + 2 or (ranks // p) % ep:
                continue
            dp = ranks // p
            nodes = group_nodes(per_node, p, dp, ep)
            key = (ep, nodes)
            if key not in profiles:
                profiles[key] = analytic_profile(spec, hw, tp, job.micro_batch_sizes, recompute=mode,
                                                 expert=ExpertParallel(ep=ep, nodes=nodes, zero=job.zero))
            prof = profiles[key]
            for sharding in modes:
                par = Parallelism.of_plan(p=p, dp=dp, t=t, sharding=sharding, ep=ep)
                runners = offered(_runners(job, mode, sharding), par, skipped)
                families = _families(job, runners, skipped)
                if not families:
                    continue
                sf = state_factor(dp, sharding=sharding)
                esf = state_factor(dp // ep, sharding=sharding)
                weights = sum(x.param_bytes * sf + x.expert_param_bytes * (esf - sf) for x in prof.layers)
                if weights / p > job.usable:
                    why = "weights, gradients and optimizer state alone exceed the GPU's usable memory"
                    if mode == recompute_modes(job)[0]:
                        skipped[why] = skipped.get(why, 0) + 1
                    continue
                cl = ExpertPipeline(devices=ranks, per_node=per_node, memory=job.usable, intra=hw.intra,
                                    inter=hw.inter, state_factor=sf, expert_state_factor=esf, pipeline=p, ep=ep)
                out.append(MoESearcher(profile=prof, cluster=cl, global_batch=job.global_batch, job=job, t=t, ep=ep,
                                       space=replace(job.space, families=families, recompute=(False,)),
                                       recompute=mode, replay=replay, sharding=sharding, frameworks=runners,
                                       _schedules=shared, skipped=skipped))
    return out
