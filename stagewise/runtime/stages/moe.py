"""A mixture-of-experts block: a top-k router, routed experts, optional shared experts, a load-balancing loss.

``MoE(d_model, experts, top_k, hidden)`` maps hidden states (B, T, d) to ``(output, aux)``: the routed experts'
weighted sum plus the shared experts', and the block's auxiliary load-balancing loss, a scalar to add to the
model's loss. The router is a softmax over ``experts`` logits; each token goes to its ``top_k`` experts with
those probabilities renormalised to sum to 1 (Mixtral's rule; ``top_k`` 1 keeps the raw probability, Switch's).

Everything is decided per sequence (a row of the batch), as DeepSeek-V3's sequence-wise balance loss is:

- the loss is ``aux`` x the mean over rows of sum_e f_e P_e, with f_e = experts / (top_k T) x the tokens of
  the row routed to e and P_e the row's mean router probability of e (1 when the routing is uniform);
- with ``capacity`` c an expert takes at most C = ceil(c T top_k / experts) tokens of a row: first choices
  before second choices, earlier tokens first; the rest is dropped for that expert (the token keeps its other
  experts, the shared ones and its residual). ``pad`` sends every expert exactly C slots per row, zeros in the
  unused ones (fixed-size buffers: Megatron-LM's padding to capacity), with the same result.

So cutting a batch into micro-batches or data shards, or sharding the experts over ranks (parallel/ep.py),
changes nothing: the pipelined, sharded model computes what one process computes on the whole batch.

What crosses a stage boundary after the first MoE block is the pair ``WithAux(hidden, aux)`` (``pack``/``unpack``;
``hidden`` may be the layer's own pytree, such as ``(hidden, mask)``, which ``unpack`` never mistakes for the pair):
the running sum of the blocks' losses travels with the activations and the loss function adds it
(``with_aux``), so the aux loss reaches the loss through any schedule like the rest of the model, and its
gradient flows back through the same boundaries. Why not a side channel (Megatron-LM's
``MoEAuxLossAutoScaler``, which injects the aux gradient in the backward): (1) the unpipelined model
(``nn.Sequential`` of the same layers) computes the same loss value by construction, and the reported loss is
the model's whole loss; (2) nothing global: the side channel needs the loss scale (1/m micro-batches, 1/data
shards) set in a process-wide variable before each backward, while the pair is scaled with the loss it
belongs to, and recomputation, split backward, DualPipe's copies and every schedule treat it as any other
leaf; (3) a loss that is not a sum of per-layer terms (transformers' load-balancing loss is a product of sums
over all layers) can be carried as its sums. The cost is one scalar per boundary and micro-batch each way.

Example::

    class Block(nn.Module):                  # one transformer block of your own model, MLP replaced
        def __init__(self, d):
            super().__init__()
            self.attn, self.norm = MyAttention(d), nn.LayerNorm(d)
            self.moe = stagewise.MoE(d, experts=8, top_k=2, hidden=4 * d, shared=1)
        def forward(self, x):
            h, aux = stagewise.moe.unpack(x)     # a tensor before the first MoE block, a pair after
            h = h + self.attn(h)
            y, a = self.moe(self.norm(h))
            return stagewise.moe.pack(h + y, a if aux is None else aux + a)

    loss_fn = stagewise.moe.with_aux(lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()))
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ... import limits
from ..config import RunError, check_count


class Expert(nn.Module):
    """One expert: the GPT's MLP, ``d_model -> hidden -> d_model`` with a GELU."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(d_model, hidden)
        self.out = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class LocalExperts:
    """Every expert on this rank: a segment of the buffer per expert, run in turn. Immutable."""

    experts_here = None  #: all of them

    def __call__(self, buf: torch.Tensor, sizes: list[int], experts: nn.ModuleDict) -> torch.Tensor:
        parts = torch.split(buf, sizes)
        return torch.cat([experts[str(e)](part) for e, part in enumerate(parts)])


class MoE(nn.Module):
    """A mixture-of-experts MLP (see the module docstring): ``forward(x) -> (output, aux)``.

    - ``experts`` routed experts of width ``hidden``, each token to ``top_k`` of them;
    - ``shared``: shared experts every token goes through (one MLP of width ``shared x hidden``; DeepSeek's,
      Qwen2-MoE's);
    - ``capacity``: tokens an expert takes per row, as a multiple of its fair share (None: every token, dropless);
      ``pad``: fixed-size expert buffers (needs ``capacity``);
    - ``aux``: the load-balancing loss's coefficient (0: none).

    Parameters are named ``router.weight``, ``experts.<e>.fc.weight`` ... ``shared.fc.weight``: expert ``e`` keeps
    its name wherever it is placed (``parallel.ep`` keeps each rank's experts only).
    """

    def __init__(self, d_model: int, experts: int, top_k: int, hidden: int, *, shared: int = 0,
                 capacity: float | None = None, pad: bool = False, aux: float = 0.01):
        super().__init__()
        check_count("`d_model`", d_model, 1)  # here always given (check_moe skips it for GPTConfig's)
        check_moe(experts=experts, top_k=top_k, hidden=hidden, shared=shared, capacity=capacity, pad=pad, aux=aux,
                  prefix="", d_model=d_model)
        self.d_model = d_model
        self.num_experts, self.top_k, self.capacity, self.pad, self.aux = experts, top_k, capacity, pad, aux
        self.router = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleDict({str(e): Expert(d_model, hidden) for e in range(experts)})
        self.shared = Expert(d_model, shared * hidden) if shared else None
        self.exchange: Callable = LocalExperts()  #: runs the experts on the dispatched tokens (ep.py shards it)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not (isinstance(x, torch.Tensor) and x.dim() == 3 and x.is_floating_point() and x.shape[0] >= 1
                and x.shape[1] >= 1 and x.shape[2] == self.d_model):
            got = f"shape {tuple(x.shape)} ({x.dtype})" if isinstance(x, torch.Tensor) else type(x).__name__
            raise RunError(f"MoE input must be floating hidden states (rows, tokens, d_model={self.d_model}) with "
                           f"rows and tokens >= 1; got {got}")
        rows, T, d = x.shape
        logits = self.router(x)
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # (B, T, E)
        weight, choice = probs.topk(self.top_k, dim=-1)  # (B, T, K)
        if self.top_k > 1:
            weight = weight / weight.sum(-1, keepdim=True)
        aux = self._balance(probs, choice)
        routed = self._route(x.reshape(rows * T, d), choice, weight.to(x.dtype), rows, T)
        y = routed.view(rows, T, d)
        if self.shared is not None:
            y = y + self.shared(x)
        return y, aux

    def slots(self, tokens: int) -> int:
        """C, the tokens an expert takes from one row of ``tokens`` (all of them without ``capacity``)."""
        if self.capacity is None:
            return tokens * self.top_k
        if self.capacity * self.top_k >= self.num_experts:  # C >= tokens: a row never sends an expert more
            return tokens
        return max(1, math.ceil(self.capacity * tokens * self.top_k / self.num_experts))

    def _balance(self, probs: torch.Tensor, choice: torch.Tensor) -> torch.Tensor:
        """The sequence-wise balance loss: ``aux`` x mean over rows of sum_e f_e P_e (before any drop)."""
        if not self.aux:
            return probs.new_zeros(())
        rows, T, E = probs.shape
        counts = F.one_hot(choice.reshape(rows, -1), E).sum(1).to(probs.dtype)  # (B, E), no gradient
        f = counts * (E / (self.top_k * T))
        return self.aux * (f * probs.mean(1)).sum(-1).mean()

    def _route(self, x: torch.Tensor, choice: torch.Tensor, weight: torch.Tensor, rows: int, T: int) -> torch.Tensor:
        """Each kept (token, expert) assignment's row through its expert, weighted and summed per token."""
        E, K = self.num_experts, self.top_k
        # assignments in each row's priority order (first choices first, then earlier tokens): (B, K*T)
        eid = choice.transpose(1, 2).reshape(rows, K * T)
        tok = (torch.arange(T, device=x.device).repeat(K) + T * torch.arange(rows, device=x.device)[:, None])
        gate = weight.transpose(1, 2).reshape(rows, K * T)
        pos = _rank_within(eid + E * torch.arange(rows, device=x.device)[:, None], rows * E).view(rows, K * T)
        keep = pos < self.slots(T)
        eid, tok, gate, pos = eid[keep], tok[keep], gate[keep], pos[keep]
        row = keep.nonzero()[:, 0]
        if self.pad:  # expert e's buffer: C slots per row, row-major
            cap = self.slots(T)
            slot = eid * (rows * cap) + row * cap + pos
            sizes = [rows * cap] * E
        else:  # expert e's buffer: its assignments in (row, priority) order
            per = torch.bincount(eid, minlength=E)
            before = torch.cumsum(per, 0) - per
            slot = before[eid] + _rank_within(eid, E)
            sizes = per.tolist()
        buf = x.new_zeros(sum(sizes), x.shape[1]).index_copy(0, slot, x.index_select(0, tok))
        out = self.exchange(buf, sizes, self.experts)
        return x.new_zeros(x.shape).index_add(0, tok, out.index_select(0, slot) * gate[:, None])


def _rank_within(keys: torch.Tensor, groups: int) -> torch.Tensor:
    """For each element of ``keys`` (flattened, in order), how many earlier elements have the same key."""
    flat = keys.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=groups)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(flat.numel(), device=flat.device) - starts[flat[order]]
    return rank


def check_moe(*, experts: int, top_k: int, hidden: int, shared: int = 0, capacity: float | None = None,
              pad: bool = False, aux: float = 0.0, prefix: str = "moe_", d_model: int | None = None) -> None:
    """The block's options against their rules (``RunError`` naming the option: ``prefix`` + its name, as the
    caller calls it: ``MoE(experts=...)``, ``GPTConfig(moe_experts=...)``); with ``d_model``, also its size
    against ``limits.PARAMETERS`` and ``ELEMENTS`` (before any tensor is allocated)."""
    n = {k: f"`{prefix}{k}`" for k in ("experts", "top_k", "hidden", "shared", "capacity", "pad", "aux")}
    if d_model is not None:
        check_count("`d_model`", d_model, 1)
    check_count(n["experts"], experts, 1)
    check_count(n["top_k"], top_k, 1)
    check_count(n["hidden"], hidden, 1)
    check_count(n["shared"], shared, 0)
    if top_k > experts:
        raise RunError(f"{n['top_k']} {top_k}: a token goes to at most {n['experts']} ({experts}) experts")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, (int, float))
                                 or not 0 < capacity < math.inf):
        raise RunError(f"{n['capacity']} must be a finite number > 0 (a multiple of an expert's fair share); got "
                       f"{capacity!r}")
    if not isinstance(pad, bool):
        raise RunError(f"{n['pad']} must be True or False; got {pad!r}")
    if pad and capacity is None:
        raise RunError(f"{n['pad']} pads every expert's buffer to its capacity: give {n['capacity']} too")
    if isinstance(aux, bool) or not isinstance(aux, (int, float)) or not 0 <= aux < math.inf:
        raise RunError(f"{n['aux']} must be a finite number >= 0; got {aux!r}")
    if d_model is not None:
        _check_size(n, experts, hidden, shared, d_model)


def _check_size(n: dict, experts: int, hidden: int, shared: int, d_model: int) -> None:
    """The block's tensors and parameter count within ``limits`` (a 10^12-expert block fails here, not in the
    allocator)."""
    for what, elements in ((f"{n['experts']} {experts} x `d_model` {d_model} (the router)", experts * d_model),
                           (f"{n['hidden']} {hidden} x `d_model` {d_model} (an expert)", hidden * d_model),
                           (f"{n['shared']} {shared} x {n['hidden']} {hidden} x `d_model` {d_model} (the shared "
                            "experts)", shared * hidden * d_model)):
        limits.ELEMENTS.check(elements, "", detail=what)
    per_expert = 2 * d_model * hidden + d_model + hidden  # fc and out, with their biases
    limits.PARAMETERS.check((experts + shared) * per_expert + experts * d_model, "",
                            detail=f"{n['experts']} {experts} experts of `d_model` {d_model} x {n['hidden']} {hidden}")


# ---- the running aux loss, carried across stage boundaries with the hidden states

class WithAux(NamedTuple):
    """What a layer passes on after the first MoE block (``pack``): its own output, a tensor or any pytree such
    as ``(hidden, mask)``, and the running aux loss. A type of its own, so a layer's own pair is never taken
    for the aux loss."""

    hidden: Any
    aux: torch.Tensor


def unpack(x) -> tuple[Any, torch.Tensor | None]:
    """``(hidden, aux)`` of what a layer received: ``pack``'s ``WithAux`` gives its two parts; anything else (a
    tensor, a ``(hidden, mask)`` pair: no MoE block before it) is the hidden part whole, with aux None."""
    if isinstance(x, WithAux):
        return x.hidden, x.aux
    return x, None


def pack(hidden, aux: torch.Tensor | None):
    """What a layer passes on: its output (a tensor or its own pytree), with the running aux loss when there is
    one (a ``WithAux``)."""
    if aux is not None and not isinstance(aux, torch.Tensor):
        raise RunError(f"stagewise.moe.pack: `aux` must be the running aux loss as a tensor, or None; got "
                       f"{type(aux).__name__}")
    return hidden if aux is None else WithAux(hidden, aux)


def with_aux(loss_fn: Callable) -> Callable:
    """``loss_fn(output, target)`` plus the aux loss the output carries (none: ``loss_fn``'s alone)."""
    if not callable(loss_fn):
        raise RunError(f"stagewise.moe.with_aux: `loss_fn` must be a function (output, target) -> loss, such as "
                       f"torch.nn.functional.cross_entropy; got {type(loss_fn).__name__}")

    def loss(output, target):
        out, aux = unpack(output)
        value = loss_fn(out, target)
        return value if aux is None else value + aux.to(value.dtype)

    return loss
