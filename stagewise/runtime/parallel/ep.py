"""Expert parallelism: a stage's MoE experts sharded over its ``ep`` group, tokens moved by all-to-all.

The ``ep`` dimension of the grid (mesh.py) is a data dimension: the ep ranks of a pipeline rank hold the same
stages and take different rows of each step's batch, like data-parallel replicas, except that each keeps
only its share of every MoE block's routed experts (experts ``[k E/ep, (k+1) E/ep)`` on ep rank ``k``, named
as in the whole model). An MoE block (stages/moe.py) lays its kept assignments out expert by expert; here
the buffer is *dispatched* (each rank's rows for expert e go to the rank holding e: an all-to-all of uneven
sizes, after one of the counts), run through the local experts, and *combined* (the reverse all-to-all).
Both are autograd functions whose backward is the all-to-all the other way, so a backward (B, or I of a split
backward) moves the gradients back along the same routes; W has none. Every all-to-all is posted
asynchronously and waited through ``execution.overlap.wait``: inside an F&B pair the rank runs the other
micro-batch meanwhile.

Gradients: a dense parameter's copies on the ep ranks took different rows, so they are summed over the
stage's data group (dp x ep); an expert's gradient already sums every ep rank's tokens (the all-to-all
brought them), so it is summed over dp only. The global norm counts each expert once over the ep group.

Routing, capacity and the balance loss are per sequence (moe.py), so ep changes nothing but where the experts
run: pp x ep equals one process on the whole batch.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from ..execution import overlap
from ..run.config import RunError
from ..stages.moe import MoE
from .dp import DataParallel


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group, name: str) -> torch.Tensor:
    """Rows ``x`` split by ``send`` (one count per rank of ``group``) exchanged for ``recv`` rows from each;
    differentiable (the backward sends the gradients back the other way), posted asynchronously and waited
    through ``overlap.wait`` (``name``: "dispatch" or "combine", what an interleaved pair's events say)."""
    return _AllToAll.apply(x, send, recv, group, name)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send, recv, group, name):
        ctx.route = (send, recv, group, name)
        return _exchange(x, send, recv, group, name)

    @staticmethod
    def backward(ctx, grad):
        send, recv, group, name = ctx.route
        return _exchange(grad, recv, send, group, name), None, None, None, None


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group, name: str) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    work = dist.all_to_all_single(out, x.contiguous(), recv, send, group=group, async_op=True)
    overlap.wait(work, name)
    return out


class ExpertExchange:
    """An MoE block's experts on an ep group: dispatch, the local experts, combine. Immutable."""

    def __init__(self, group, rank: int, size: int, experts: int, fixed: bool):
        self.group, self.rank, self.size = group, rank, size
        self.per = experts // size  #: experts per rank
        self.experts_here = range(rank * self.per, (rank + 1) * self.per)
        self.fixed = fixed  #: every expert's buffer has one size (padding): no counts to exchange

    def __call__(self, buf: torch.Tensor, sizes: list[int], experts: nn.ModuleDict) -> torch.Tensor:
        per, size = self.per, self.size
        send = [sum(sizes[r * per:(r + 1) * per]) for r in range(size)]
        if self.fixed:
            got = [[sizes[0]] * per for _ in range(size)]
        else:  # how many rows of each of my experts every rank sends
            counts = torch.tensor(sizes, dtype=torch.int64, device=buf.device)
            out = torch.empty_like(counts)
            dist.all_to_all_single(out, counts, group=self.group)  # a few numbers: waited at once, no handover
            got = out.view(size, per).tolist()
        rows = all_to_all(buf, send, [sum(g) for g in got], self.group, "dispatch")
        pieces = list(torch.split(rows, [n for g in got for n in g]))  # source-major, then my experts
        results = [None] * len(pieces)
        for j, e in enumerate(self.experts_here):
            mine = [pieces[s * per + j] for s in range(size)]
            y = experts[str(e)](torch.cat(mine))
            for s, part in enumerate(torch.split(y, [len(p) for p in mine])):
                results[s * per + j] = part
        back = torch.cat(results) if results else rows
        return all_to_all(back, [sum(g) for g in got], send, self.group, "combine")


def moe_blocks(stages: dict[int, nn.Module]) -> list[MoE]:
    return [m for st in stages.values() for m in st.modules() if isinstance(m, MoE)]


def shard(block: MoE, group, rank: int, size: int) -> None:
    """Keep only ep rank ``rank``'s experts of ``block`` and run them through the group (names unchanged)."""
    if block.num_experts % size:
        raise RunError(f"`ep` {size} must divide the MoE block's {block.num_experts} experts (`moe_experts`): each "
                       "rank of the expert-parallel group holds the same number of them")
    ex = ExpertExchange(group, rank, size, block.num_experts, block.pad)
    for e in range(block.num_experts):
        if e not in ex.experts_here:
            del block.experts[str(e)]
    block.exchange = ex


class ExpertParallel:
    """This rank's ep group and the experts it holds. Mutable: owns its process groups.

    Built by every rank alike (the ep group is the grid's, grid.py): shards every MoE block of ``stages`` in
    place.
    """

    def __init__(self, grid, stages: dict[int, nn.Module], device=None):
        self.size = grid.topo.size("ep")
        self.rank = grid.topo.coords["ep"]
        self.group = grid.group("ep")
        self.blocks = moe_blocks(stages)
        count = torch.tensor([len(self.blocks)], dtype=torch.int64, device=device)
        dist.all_reduce(count)
        if not int(count):
            raise RunError(f"`ep` {self.size}: the model has no stagewise.MoE block to shard its experts (an HF "
                           "model's experts stay whole: run it with `ep` 1)")
        for block in self.blocks:
            shard(block, self.group, self.rank, self.size)
        #: the parameters sharded over the group (the routed experts): summed over dp only, normed over ep
        self.sharded = {id(p) for b in self.blocks for p in b.experts.parameters()}

    def reduction(self, grid, stages: dict[int, nn.Module], timeout_s: float) -> "ExpertDataParallel":
        return ExpertDataParallel(grid, stages, timeout_s, self.sharded)


class ExpertDataParallel(DataParallel):
    """Data-parallel sums of an expert-parallel pipeline: a stage's dense parameters over dp x ep, its experts
    over dp (none when dp is 1). Mutable: the step's reductions in flight (DataParallel's)."""

    def __init__(self, grid, stages: dict[int, nn.Module], timeout_s: float, sharded: set[int]):
        self.stages, self.sharded = stages, sharded
        self.timeout = timedelta(seconds=timeout_s)
        self.dense = grid.group(("dp", "ep"))
        self.replicas = grid.group("dp") if grid.topo.dp > 1 else None
        self.pending, self.started = [], []

    def buckets(self, s: int) -> list:
        params = [p for p in self.stages[s].parameters() if p.requires_grad]
        out = [([p for p in params if id(p) not in self.sharded], self.dense)]
        if self.replicas is not None:
            out.append(([p for p in params if id(p) in self.sharded], self.replicas))
        return [(ps, g) for ps, g in out if ps]

