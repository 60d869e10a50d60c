"""From a profile and a split to what the simulator and the partitioner read.

``layer_costs`` gives the partitioner one number per layer; ``stage_costs``
sums layers into the per-stage ``Costs`` of a schedule (its stages map onto the
model's pieces through ``Holding``), with the link time of every stage boundary.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

from ...costs import Costs
from .devices import Cluster
from .holding import Holding
from .partition import LayerCosts
from .profile import Profile


def layer_costs(profile: Profile, mbs: int, recompute: bool, state_factor: float,
                cluster: Cluster | None = None) -> LayerCosts:
    """Per-layer work (compute: a lower bound, an F&B pair may hide its all-to-all), fixed bytes (routed
    experts' at ``cluster.expert_state_factor``) and activation bytes at micro-batch size ``mbs``."""
    k = profile.size_index(mbs)
    L = profile.layers
    # a recomputed layer runs its forward again inside the backward
    time = tuple(x.t_f[k] * (2 if recompute else 1) + x.t_b[k] for x in L)
    extra = cluster.expert_surplus if cluster is not None else (lambda _: 0.0)
    return LayerCosts(
        time=time,
        fixed=tuple(x.param_bytes * state_factor + extra(x.expert_param_bytes) for x in L),
        act=tuple(x.activation_bytes[k] for x in L),
        input_bytes=tuple(x.input_bytes[k] for x in L) if recompute else None,
    )


def stage_costs(profile: Profile, counts, h: Holding, mbs: int, recompute: bool,
                cluster: Cluster, p: int, dp: int) -> Costs:
    """Per-stage Costs of a schedule whose pieces hold ``counts`` layers each.

    Link times reach the simulator through ``boundary_bytes`` with
    ``bandwidth=1``: each boundary's seconds, since the node-internal and the
    cross-node links differ per boundary.
    """
    k = profile.size_index(mbs)
    bounds = [0, *accumulate(counts)]
    spans = [range(bounds[h.stage_piece[s]], bounds[h.stage_piece[s] + 1]) for s in range(len(h.stage_piece))]
    L = profile.layers

    def total(field: str) -> list[float]:
        return [sum(getattr(L[i], field)[k] for i in span) for span in spans]

    act = total("activation_bytes")
    link = []
    for s, span in enumerate(spans):
        nxt = s + 1 if s + 1 < len(spans) else s
        lk = cluster.link(p, dp, h.stage_rank[s], h.stage_rank[nxt])
        link.append(lk.time(L[span[-1]].output_bytes[k]))
    keep = [L[span[0]].input_bytes[k] / a if a else 0.0 for span, a in zip(spans, act)]
    comm = {}
    if any(x.a2a for x in L):  # MoE layers' all-to-all, its own resource in the simulator
        comm = {name: [sum(getattr(L[i], field)[k] for i in span if getattr(L[i], field)) for span in spans]
                for name, field in (("a2a", "a2a"), ("a2a_b", "a2a_b"))}
    return Costs(t_f=total("t_f"), t_b=total("t_b"), t_i=total("t_i"), t_w=total("t_w"),
                 boundary_bytes=link, bandwidth=1.0, latency=0.0, activation_bytes=act,
                 recompute=recompute, recompute_keep=keep if recompute else 0.0, **comm)


def piece_layer_bytes(profile: Profile, counts) -> list[list[float]]:
    """Parameter bytes of each layer of each model piece of the split ``counts``."""
    bounds = [0, *accumulate(counts)]
    return [[x.param_bytes for x in profile.layers[lo:hi]] for lo, hi in zip(bounds, bounds[1:])]


def piece_param_bytes(profile: Profile, counts) -> list[float]:
    """Parameter bytes of each model piece of the split ``counts``."""
    return [sum(layers) for layers in piece_layer_bytes(profile, counts)]


def stage_param_bytes(profile: Profile, counts, h: Holding) -> list[float]:
    """Parameter bytes of each schedule stage (its piece's: DualPipe's two copies of a piece alike)."""
    piece = piece_param_bytes(profile, counts)
    return [piece[k] for k in h.stage_piece]


def rank_fixed_bytes(profile: Profile, counts, h: Holding, state_factor: float,
                     cluster: Cluster | None = None) -> list[float]:
    """Parameter-related bytes per rank (a rank holding two copies of a piece pays twice; routed experts'
    at ``cluster.expert_state_factor``)."""
    bounds = [0, *accumulate(counts)]
    extra = cluster.expert_surplus if cluster is not None else (lambda _: 0.0)
    pieces = [profile.layers[bounds[j]:bounds[j + 1]] for j in range(len(counts))]
    per_piece = piece_param_bytes(profile, counts)
    surplus = [sum(extra(x.expert_param_bytes) for x in layers) for layers in pieces]
    return [state_factor * sum(per_piece[h.stage_piece[s]] for s in h.rank_stages[r])
            + sum(surplus[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)]


def rank_transient_bytes(profile: Profile, counts, h: Holding, mbs: int, recompute: bool) -> list[float]:
    """With recomputation: one micro-batch's full activations, rebuilt for a backward."""
    if not recompute:
        return [0.0] * h.ranks
    k = profile.size_index(mbs)
    bounds = [0, *accumulate(counts)]
    full = [sum(profile.layers[i].activation_bytes[k] for i in range(bounds[j], bounds[j + 1]))
            for j in range(len(counts))]
    return [max(full[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)]


def rank_optimizer_time(profile: Profile, counts, h: Holding) -> list[float]:
    """Seconds of the optimizer step on each rank (over every piece copy it holds)."""
    bounds = [0, *accumulate(counts)]
    per_piece = [sum(profile.layers[i].t_opt for i in range(bounds[j], bounds[j + 1])) for j in range(len(counts))]
    return [sum(per_piece[h.stage_piece[s]] for s in h.rank_stages[r]) for r in range(h.ranks)]


def step_sync_time(profile: Profile, counts, h: Holding, cluster: Cluster, p: int, dp: int) -> float:
    """Step-end collectives inside one pipeline: tied weights held on several ranks sum their
    gradients, and the loss is summed over the ranks (as the runtime does)."""
    total = cluster.small_allreduce(p, cluster.link(p, dp, 0, p - 1))  # the loss
    if not profile.tied:
        return total
    piece_of_layer = [piece for piece, n in enumerate(counts) for _ in range(n)]
    ranks_of_piece: list[set] = [set() for _ in counts]
    for s, piece in enumerate(h.stage_piece):
        ranks_of_piece[piece].add(h.stage_rank[s])
    for layers, nbytes in profile.tied:
        ranks = sorted(set().union(*(ranks_of_piece[piece_of_layer[i]] for i in layers)))
        if len(ranks) > 1:
            total += cluster.small_allreduce(len(ranks), cluster.link(p, dp, ranks[0], ranks[-1]), nbytes)
    return total


def blocking_p2p(costs: Costs, h: Holding) -> Costs:
    """``costs`` with blocking point-to-point messages (DeepSpeed's pipeline engine): the sender's F waits
    for its activation to arrive at the next stage, its B (or I) for its input gradient to reach the previous
    one, so each boundary's seconds move from the link into the sender's compute (stage_costs gives them in
    ``boundary_bytes`` with ``bandwidth=1``)."""
    n = len(h.stage_piece)
    link = list(costs.boundary_bytes)
    crosses = [s + 1 < n and h.stage_rank[s] != h.stage_rank[s + 1] for s in range(n)]
    send_f = [link[s] if crosses[s] else 0.0 for s in range(n)]
    send_b = [link[s - 1] if s and crosses[s - 1] else 0.0 for s in range(n)]
    return replace(costs, t_f=[a + x for a, x in zip(costs.t_f, send_f)],
                   t_b=[a + x for a, x in zip(costs.t_b, send_b)], t_i=[a + x for a, x in zip(costs.t_i, send_b)],
                   boundary_bytes=[0.0] * n)
