"""A cluster candidate's step from playing its lowered program: the data-parallel traffic as actions.

``finish`` costs a configuration's gradient reductions and weight gathers from the simulated timeline with the
O(stages) rules of ``data_parallel`` (cheap: every simulated configuration gets them). The step a plan reports
is the lowered program's instead (``stagewise.lowering``, the rules the runtime executes and the simulator
plays): each stage's ``UNSHARD`` and ``REDUCE_GRAD`` on its group's stream at the framework's overlap rule
(a ``layer`` rule bucket by bucket, the stage's layers), the gathers delaying the forwards that need them,
DualPipe's two copies of a stage summed (``TIE_GRAD``), on the layout's own links (the device order of its
``StageGrid``). Its boundaries carry no bytes (the cost model's link time is each message's), so the messages
are played as link times between the ops (``LoweringOptions.p2p`` False: the same span as lowered sends,
three times fewer actions). A sharded layout's memory is read off the same program (``held_memory``). Only the configurations that can still reach the top are lowered: compute alone is a lower
bound on the lowered step (a transfer only ever delays an op or the step's end), so the search stays exact.

What stays analytic: the tied embedding's sum and the loss's (``step_sync_time``, over the pipeline ranks;
the lowering's ``STEP_END`` is a ring over the whole world, whose latency term is not what NCCL's small
all-reduces cost at thousands of GPUs), the optimizer step and the step overhead. The expert all-to-all is
inside each op already (the analytic profile's ``a2a``). A long step's exposure is the one of its ``mc``
stand-in (``steady``): what runs past the compute repeats neither with the micro-batches nor the steady state.

The routed experts' weights travel over their replicas on their own link; as in ``_reduction_bytes`` they
count at the ratio of the two per-byte times, so one collective per stage carries both.
"""

from __future__ import annotations

from dataclasses import replace

from ...lowering import Communication, Lowered, LoweringOptions, Network, Overlap, Sizes
from ...lowering.rank_memory import lowered_memory
from ...lowering.options import PIPELINE_OUTERMOST
from ...parallelism import DIMS, Parallelism
from ..search import network as network_of, piece_layer_bytes, rank_fixed_bytes
from .candidate import MemoryParts
from .data_parallel import GRAD_BYTES_PER_PARAM_BYTE, gathered_factor
from .placement import StageGrid
from .overlap_rules import Framework


def overlap(fw: Framework, per_block: bool = False) -> Overlap:
    """``fw``'s rule as the lowering's, less its blocking sends: the planner's costs already hold those
    (``search.blocking_p2p`` moves each boundary's seconds into the sender's op). ``per_block``
    (``Framework.per_block``): FSDP reduce-scatters each layer's gradients as every backward leaves it (its
    gradient sync is never turned off: torchtitan's accumulation steps each reduce-scatter)."""
    rule = fw.overlap
    return replace(rule, blocking_p2p=False, fsdp_reduce="each" if per_block else rule.fsdp_reduce)


def network(grid: StageGrid) -> Network:
    """The layout's links, in the grid's device order (``grid.PLACEMENTS``)."""
    return network_of(grid.node, grid.intra, grid.inter, PIPELINE_OUTERMOST if grid.placement == "within" else DIMS)


def communication(par: Parallelism, stage_layers: list[list[float]], gather_scale: float, fw: Framework,
                  grid: StageGrid) -> Communication:
    """What ``Costs.comm`` holds for a candidate: ``stage_layers`` each stage's layers' bf16 weight bytes on one
    GPU of its t-group (the routed experts' folded in, ``_reduction_bytes``). A layout that reshards after
    forward (``Framework.per_block``) runs FSDP block by block: gathers per op, reductions per layer."""
    stage_bytes = [sum(layers) for layers in stage_layers]
    sizes = Sizes(params=[b * gather_scale for b in stage_bytes],
                  grads=[b * GRAD_BYTES_PER_PARAM_BYTE for b in stage_bytes],
                  layers=tuple(stage_layers))
    opts = LoweringOptions(overlap=overlap(fw, par.reshard_after_forward), sizes=sizes, network=network(grid), moe=False,
                           step_end=False, p2p=False)
    return Communication(parallelism=par, options=opts)


def held_memory(low: Lowered, pre, h, profile, cluster, sharding: str) -> tuple[tuple[float, ...], MemoryParts]:
    """A sharded (FSDP, HSDP) configuration's memory per rank and the fullest rank's ``MemoryParts`` from its
    lowered program (``lowering.rank_memory``): each stage's gathered bf16 weights from its UNSHARD to its RESHARD and
    its fp32 unsharded gradients from its first weight backward to its REDUCE_GRAD, beside the activations over
    the program, where ``prepare`` (``pre``) summed their peaks: an upper bound, as the lowered peak is never
    more, so ``fits`` stays decided by the sum."""
    pieces = piece_layer_bytes(profile, pre.counts)
    layers = tuple(pieces[k] for k in h.stage_piece)  # DualPipe's two copies of a piece alike
    weights = [sum(xs) for xs in layers]
    sized = replace(low, options=replace(low.options, sizes=Sizes(
        params=weights, grads=[GRAD_BYTES_PER_PARAM_BYTE * b for b in weights], layers=layers)))
    sc = pre.costs.resolve(low.schedule.stages)
    held = lowered_memory(sized, sc.activation_bytes, sc.free_at_i)
    rest = [m - g - a for m, g, a in zip(pre.memory, pre.gathered, pre.activations)]  # state and transients
    memory = tuple(x + m.peak.total for x, m in zip(rest, held))
    r = max(range(len(memory)), key=memory.__getitem__)
    state = (rank_fixed_bytes(profile, pre.counts, h, cluster.state_factor, cluster)[r]
             - rank_fixed_bytes(profile, pre.counts, h, gathered_factor(sharding))[r])
    top = held[r].peak
    return memory, MemoryParts(state=state, gathered=top.gathered + top.grads, activations=top.activations,
                               transient=rest[r] - state)
