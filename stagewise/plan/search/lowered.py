"""The data-parallel traffic of a plan as actions: its schedule lowered and played (``stagewise.lowering``).

The planner's costs give every boundary its link time and no bytes, so the lowering leaves the messages as link
times between the ops (``LoweringOptions.p2p`` False, what ``engine.play`` does) and plays each stage's
collectives on its group's stream. What the played step runs past the same schedule's compute alone is the
traffic the step exposes. A local plan is stagewise's own run (``FRAMEWORKS["stagewise"]``: a stage's gradients
all-reduced over dp after its last backward, asynchronously, as runtime/parallel/dp.py does); a cluster plan
lowers under each framework's rule (plan/cluster/lowered.py).
"""

from __future__ import annotations

import math

from ...costs import Costs
from ...lowering import FRAMEWORKS, Communication, Lowered, LoweringOptions, Network, Sizes
from ...comm_actions import UNSHARD
from ...lowering.play import step_span
from ...parallelism import DIMS, Parallelism
from .devices import Cluster
from .profile import Link


def exposure(low: Lowered, costs: Costs, compute_span: float) -> tuple[float, float]:
    """(what the lowered step runs past the same schedule's compute alone, the part of it a rank waited on
    weight gathers for): the step's extra seconds, and how much of them ``UNSHARD`` left exposed."""
    span, worst = step_span(low, costs)
    extra = max(0.0, span - compute_span)
    return extra, min(extra, worst.get(UNSHARD, 0.0))


def network(gpus_per_node: int, intra: Link, inter: Link, order: tuple[str, ...] = DIMS) -> Network:
    """The lowering's ``Network`` of a plan's two links (an infinitely fast one: free)."""
    def bw(link: Link) -> float | None:
        return link.bandwidth if math.isfinite(link.bandwidth) else None

    return Network(gpus_per_node=gpus_per_node, intra_bandwidth=bw(intra), intra_latency=intra.latency,
                   inter_bandwidth=bw(inter), inter_latency=inter.latency, order=order)


def local_data_parallel(sched, costs: Costs, stage_bytes: list[float], par: Parallelism, cluster: Cluster,
                        compute_span: float) -> float:
    """Seconds a local plan's dp all-reduce runs past its compute: the schedule lowered for ``par`` (p ranks x dp
    replicas, ``Config.parallelism``) under stagewise's rule, ``stage_bytes`` each stage's weights (and gradients:
    the same dtype), the replicas ``p`` devices apart on the cluster's links (``Cluster``'s numbering: the mesh's,
    the pipeline inside)."""
    if par.dp == 1:
        return 0.0
    net = network(cluster.per_node, cluster.intra, cluster.inter)
    opts = LoweringOptions(overlap=FRAMEWORKS["stagewise"], sizes=Sizes(params=stage_bytes, grads=stage_bytes),
                           network=net, moe=False, step_end=False, p2p=False)
    comm = Communication(parallelism=par, options=opts)
    return exposure(comm.lower(sched), costs, compute_span)[0]
