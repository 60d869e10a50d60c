"""Where a stage's GPUs sit: the device order of a layout, and the links and expert groups that follow from it.

A pipeline rank is a stage's pool of t x dp GPUs (dp tensor-parallel groups of t). Attention is cut t ways over
it; the MoE layers have a layout of their own over the same GPUs (MoE parallel folding, Megatron-Core,
arXiv:2504.14960): expert tensor parallel ``etp`` innermost, then expert parallel ``ep``, then the expert
data-parallel replicas, ``etp x ep x replicas = t x dp``. Megatron-LM's traditional layout is etp = t; folding
lets ``--etp 1 --tp 2 --ep 8`` keep EP 8 inside one 8-GPU node. A dense model is the layout
with ep 1.

Placement (``PLACEMENTS``) is the device order: "within" is Megatron-Core's default (tensor, expert, data,
pipeline: the pipeline outermost), so an expert group is ``ep x etp`` consecutive GPUs, one node when it fits,
and pipeline neighbours sit ``t x dp`` GPUs apart; "across" puts the pipeline inside (tensor, pipeline, data:
``--use-tp-pp-dp-mapping``), so a pipeline's stages share a node and an expert group's members sit ``t x p``
GPUs apart, on other nodes. Dense layouts are planned "across" (replica d's pipeline rank r is t-group
``d x p + r``: a pipeline stays inside a node when it fits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from ...parallelism import Parallelism
from ..search import Cluster, Link

#: device orders a layout may take (see the module doc)
PLACEMENTS = ("within", "across")


@dataclass(frozen=True, kw_only=True)
class StageGrid(Cluster):
    """A Cluster searched at one layout, its devices in ``placement``'s order (``devices`` and ``per_node``
    count t-groups, ``node`` GPUs)."""

    #: pp, tp and the expert layout (``expert_degree`` GPUs a block's routed experts are spread over, each cut
    #: over ``expert_tp``); the data ranks however the searcher shards them
    parallelism: Parallelism = field(default_factory=Parallelism)
    node: int = 8  #: GPUs per node
    placement: str = "across"

    def layouts(self) -> list[tuple[int, int]]:
        return [(self.parallelism.pp, self.devices // self.parallelism.pp)]

    @property
    def pool(self) -> int:
        """GPUs at one pipeline position: t x dp."""
        return self.parallelism.per_pipeline_rank

    @property
    def group(self) -> int:
        """GPUs of one expert group: ep x etp."""
        return self.parallelism.expert_degree * self.parallelism.expert_tp

    @property
    def replicas(self) -> int:
        """Expert data parallel: the GPUs of a stage holding the same expert shard."""
        return self.pool // self.group

    def nodes(self) -> int:
        """Most nodes one expert group spans."""
        return group_nodes(self.node, self.parallelism.pp, self.pool, self.parallelism.tp, self.group, self.placement)

    def link(self, p: int, dp: int, a: int, b: int) -> Link:
        """Pipeline ranks a and b of one replica."""
        crosses = _pipeline_crosses(self.node, p, self.pool, self.parallelism.tp, self.placement, a, b)
        return self.inter if crosses else self.intra

    def data_parallel_link(self, p: int, dp: int) -> Link:
        """``dp`` data-parallel replicas of one tensor-parallel rank (pool positions t apart)."""
        t = self.parallelism.tp
        crosses = dp > 1 and _nodes(self.node, p, self.pool, t, self.placement, t, dp) > 1
        return self.inter if crosses else self.intra

    def expert_data_parallel_link(self, p: int, dp: int) -> Link:
        """The replicas that hold the same expert shard: pool positions ep x etp apart."""
        n = self.replicas
        crosses = n > 1 and _nodes(self.node, p, self.pool, self.parallelism.tp, self.placement, self.group, n) > 1
        return self.inter if crosses else self.intra


def expert_layouts(experts: int, pool: int, t: int, eps=None, etps=None) -> list[tuple[int, int]]:
    """(ep, etp) tried on a stage's ``pool`` = t x dp GPUs: ``eps`` (None: every divisor of the pool that
    divides the ``experts``) with ``etps`` (None: t and 1), ep x etp dividing the pool and a multiple of t (so
    the layout is a ``Parallelism``: ep x etp / t data ranks share each block's experts)."""
    eps = eps or tuple(e for e in range(1, pool + 1) if pool % e == 0 and experts % e == 0)
    etps = etps or tuple(dict.fromkeys((t, 1)))
    return [(e, x) for e in eps for x in etps
            if experts % e == 0 and pool % (e * x) == 0 and (e * x) % t == 0 and (x % t == 0 or t % x == 0)]


@lru_cache(maxsize=65536)
def _nodes(node: int, p: int, pool: int, t: int, placement: str, stride: int, count: int) -> int:
    """Most nodes one set of pool positions ``o + i * stride`` (i < count) spans, over every pipeline rank and
    every such set (the sets partition the pool: offsets o with ``(o // stride) % count == 0``).

    Shifting a set's GPUs by a multiple of ``node`` keeps its node count, so only one period of ranks and of
    offsets is looked at (``_periods``): O(node x stride x count) instead of O(GPUs) per layout."""
    ranks, offsets = _periods(node, p, pool, t, placement, stride * count)
    worst = 1
    for r in range(ranks):
        for o in range(offsets):
            if (o // stride) % count == 0:
                nodes = {_gpu(placement, p, pool, t, r, o + i * stride) // node for i in range(count)}
                worst = max(worst, len(nodes))
    return worst


def _periods(node: int, p: int, pool: int, t: int, placement: str, span: int) -> tuple[int, int]:
    """(ranks, offsets) after which the node pattern repeats: rank r + k starts its pool a multiple of ``node``
    GPUs after rank r, and offset o + P maps every position P' GPUs on with P' a multiple of ``node`` while
    the sets' pattern repeats every ``span`` positions."""
    step, shift = (pool, 1) if placement == "within" else (t, p)  # GPU(r, q) = r*step + q + (q//t)*(shift-1)*t
    ranks = min(p, node // math.gcd(step, node))
    q_period = node if placement == "within" else t * (node // math.gcd(shift * t, node))
    return ranks, min(pool, math.lcm(q_period, span))


def _gpu(placement: str, p: int, pool: int, t: int, r: int, q: int) -> int:
    """GPU number of pool position ``q`` (= d * t + j) of pipeline rank ``r``."""
    if placement == "within":  # pipeline outermost: rank r's pool is a block of consecutive GPUs
        return r * pool + q
    d, j = divmod(q, t)  # the pipeline inside the data replicas
    return (d * p + r) * t + j


def group_nodes(node: int, p: int, pool: int, t: int, group: int, placement: str = "within") -> int:
    """Most nodes one expert group (``group`` = ep x etp consecutive pool positions) spans."""
    return _nodes(node, p, pool, t, placement, 1, group)


@lru_cache(maxsize=65536)
def _pipeline_crosses(node: int, p: int, pool: int, t: int, placement: str, a: int, b: int) -> bool:
    _, positions = _periods(node, p, pool, t, placement, 1)  # one period of positions decides
    return any(_gpu(placement, p, pool, t, a, q) // node != _gpu(placement, p, pool, t, b, q) // node
               for q in range(positions))
