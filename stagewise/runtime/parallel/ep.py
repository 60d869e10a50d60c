"""Expert parallelism: a stage's MoE experts sharded over its ``ep`` group, tokens moved by all-to-all.

The ``ep`` dimension of the grid (mesh.py) is a data dimension: the ep ranks of a pipeline rank hold the same
stages and take different rows of each step's batch, like data-parallel replicas, except that each keeps
only its share of every MoE block's routed experts (experts ``[k E/ep, (k+1) E/ep)`` on ep rank ``k``, named
as in the whole model). An MoE block (stages/moe.py) lays its kept assignments out expert by expert; here
the buffer is *dispatched* (each rank's rows for expert e go to the rank holding e: an all-to-all of uneven
sizes, after one of the counts), run through the local experts, and *combined* (the reverse all-to-all).
Both are autograd functions whose backward is the all-to-all the other way, so a backward (B, or I of a split
backward) moves the gradients back along the same routes; W has none. Every all-to-all is posted
asynchronously and waited through ``execution.fb_pair.wait``: inside an F&B pair the rank runs the other
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

from ..execution import fb_pair
from ..config import RunError
from ..stages.moe import MoE
from .dp import DataParallel


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group, name: str) -> torch.Tensor:
    """Rows ``x`` split by ``send`` (one count per rank of ``group``) exchanged for ``recv`` rows from each;
    differentiable (the backward sends the gradients back the other way), posted asynchronously and waited
    through ``fb_pair.wait`` (``name``: "dispatch" or "combine", what an interleaved pair's events say)."""
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
    fb_pair.wait(work, name)
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


class StackedExperts(nn.Module):
    """ep rank ``rank``'s share of a mixture of experts stored stacked, as transformers 5 holds Mixtral's,
    Qwen2-MoE's, Qwen3-MoE's and DeepSeek-V3's: experts ``[rank E/ep, (rank+1) E/ep)`` of ``gate_up_proj``
    (experts x 2 inner x hidden) and ``down_proj`` (experts x hidden x inner), under the whole module's names.
    ``forward(hidden, top_k_index, top_k_weights)`` is the module's: each routed row goes to its expert's rank
    (``ExpertExchange``: the all-to-alls) and comes back weighted, summed per token as transformers sums it."""

    def __init__(self, whole: nn.Module, group, rank: int, size: int):
        super().__init__()
        experts = whole.gate_up_proj.shape[0]
        if experts % size:
            raise RunError(f"`ep` {size} must divide the model's {experts} routed experts: each rank of the "
                           "expert-parallel group holds the same number of them")
        self.exchange = ExpertExchange(group, rank, size, experts, False)
        mine = slice(self.exchange.experts_here.start, self.exchange.experts_here.stop)
        self.gate_up_proj = nn.Parameter(whole.gate_up_proj.detach()[mine].clone())
        self.down_proj = nn.Parameter(whole.down_proj.detach()[mine].clone())
        self.act_fn, self.num_experts = whole.act_fn, experts

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        k = top_k_index.shape[-1]
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the routed rows laid out expert by expert
        token = order // k
        sizes = torch.bincount(flat, minlength=self.num_experts).tolist()
        first = self.exchange.experts_here.start
        local = {str(e): (lambda x, j=e - first: self._expert(j, x)) for e in self.exchange.experts_here}
        out = self.exchange(hidden[token], sizes, local)
        weighted = out * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden).index_add_(0, token, weighted.to(hidden.dtype))

    def _expert(self, j: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = nn.functional.linear(x, self.gate_up_proj[j]).chunk(2, dim=-1)
        return nn.functional.linear(self.act_fn(gate) * up, self.down_proj[j])


def shard_stacked(stages: dict[int, nn.Module], group, rank: int, size: int) -> list[StackedExperts]:
    """Replace every stacked-experts module of ``stages`` (3-D ``gate_up_proj`` and ``down_proj``) by this ep
    rank's ``StackedExperts`` share; returns the shares."""
    out = []
    for st in stages.values():
        for parent in list(st.modules()):
            for name, child in list(parent.named_children()):
                up = getattr(child, "gate_up_proj", None)
                if isinstance(up, torch.Tensor) and up.dim() == 3 and hasattr(child, "down_proj") \
                        and not isinstance(child, StackedExperts):
                    share = StackedExperts(child, group, rank, size)
                    setattr(parent, name, share)
                    out.append(share)
    return out


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
        self.stacked = shard_stacked(stages, self.group, self.rank, self.size)  # transformers 5's MoE blocks
        count = torch.tensor([len(self.blocks) + len(self.stacked)], dtype=torch.int64, device=device)
        dist.all_reduce(count)
        if not int(count):
            raise RunError(f"`ep` {self.size}: the model has no MoE block to shard its experts (a stagewise.MoE, "
                           "or a Hugging Face mixture of experts' stacked experts)")
        for block in self.blocks:
            shard(block, self.group, self.rank, self.size)
        #: the stages whose F, B and I exchange tokens over the group (the lowering's ALL_TO_ALL stages)
        self.exchanging = frozenset(s for s, st in stages.items()
                                    if any(isinstance(getattr(m, "exchange", None), ExpertExchange)
                                           for m in st.modules()))
        #: the parameters sharded over the group (the routed experts): summed over dp only, normed over ep
        self.sharded = {id(p) for b in self.blocks for p in b.experts.parameters()} | \
            {id(p) for m in self.stacked for p in (m.gate_up_proj, m.down_proj)}

    def gather_full(self, state: dict) -> dict:
        """``state`` with each stacked-experts share (held as a plain tensor) gathered whole over the ep group
        (a collective: the ep ranks of a stage hold the same names, in the same order)."""
        mine = {p.data_ptr(): p for m in self.stacked for p in (m.gate_up_proj, m.down_proj)}
        out = dict(state)
        for name, t in state.items():
            if t.data_ptr() in mine and t.shape == mine[t.data_ptr()].shape:
                parts = [torch.empty_like(t) for _ in range(self.size)]
                dist.all_gather(parts, t.contiguous(), group=self.group)
                out[name] = torch.cat(parts)
        return out

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

