"""An analytic profile: per-layer F, I, W times and bytes of a transformer on a GPU type, no measuring.

The result is an ordinary ``Profile`` (layers ``E``, one per block ``t`` dense or ``m`` MoE, ``H``), so
the partitioner, the schedules and the simulator treat it like a measured one. Per GPU of a
tensor-parallel group of ``t``:

- time of a matrix multiply = FLOPs / t / (peak x efficiency), the linear layers' at the ``precision``'s
  rate (the hardware file's ``fp8`` entry for FP8), attention's products in bf16; I redoes the forward's
  multiplies on the input side and attention's two products twice, W redoes them on the weight side
  (Narayanan et al. 2021: backward = 2 x forward); MLA's down-projections are duplicated on every GPU of
  the group (Megatron-Core), so they are not divided by t;
- element-wise work (norms, activations, softmax, dropout) is bound by HBM: the forward writes the bytes
  it keeps for the backward, the backward reads them and writes gradients of the same size (2x);
- tensor parallel puts two all-reduces of the block's output (2 s b h bytes) on the forward's critical
  path and two on the backward's (all-gather + reduce-scatter with sequence parallel: the same bytes),
  over the node's link; with ``TensorParallel.overlap`` (torch's AsyncTP, Megatron-LM's
  ``--tp-comm-overlap``) each collective runs in t chunks behind its adjacent multiply, so only its first
  chunk and what the multiply cannot cover are exposed;
- kept bytes are ``activations.kept_bytes``' terms (Korthikanti et al. 2022, generalised term by term);
  a recomputed block keeps only its input (2 s b h);
- recomputation is one of ``RECOMPUTE``: "off"; "selective" (the ``modules`` named, Megatron-Core's
  ``--recompute-modules``; by default ``core_attn``, Korthikanti et al. Sec. 5: the attention core is
  recomputed in the backward, so its s^2 scores are never kept); "full" (the whole block is replayed).
  Flash attention keeps no scores and its backward recomputes Q K^T (5 products where the forward has 2,
  not 4), so for a flash model ``core_attn`` drops nothing;
- parameters are bf16 (2 bytes); the optimizer step streams fp32 master weights, Adam's two moments and
  the fp32 gradient through HBM (``OPT_BYTES`` per parameter), sharded over data parallel by the cluster
  search (ZeRO-1);
- a mixture-of-experts block (``TransformerSpec.moe``, symbol "m") is attention as above, a router, the
  shared experts and, per token, ``top_k`` routed experts' multiplies (each GPU of the stage computes its
  share, the busiest ``moe.load`` times the mean), with the experts' kept activations in place of the
  dense MLP's; its routed experts are sharded over ``ep`` groups of ``etp`` GPUs (``expert_param_bytes``,
  Megatron-Core's expert and expert tensor parallel), and each MoE block's dispatch and combine
  all-to-all (``expert_a2a_time``) is the profile's ``a2a``: NVLink when the group fits in a node, else
  InfiniBand once per remote node a token's experts sit on (at most ``node_limit``) with NVLink
  forwarding it inside that node, overlapped, as DeepSeek-V3's kernels do;
- the multi-token-prediction modules ride with the head ``H`` (Megatron-Core places them on the last
  stage): their projection, block and second pass through the output layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...costs import expert_copies
from .activations import BF16, RECOMPUTE_MODULES, dropped_modules, kept_bytes, recompute_flops, recompute_traffic
from ..errors import PlanError
from .hardware import PRECISIONS, Hardware
from ..search import LayerProfile, Link, Profile
from .transformer import TransformerSpec

#: bytes per parameter the optimizer step moves: fp32 master r/w (8), two fp32 moments r/w (16),
#: fp32 gradient read (4), bf16 weight written (2)
OPT_BYTES = 30
#: recomputation choices of the cluster search, least memory-saving first
RECOMPUTE = ("off", "selective", "full")
#: what "selective" recomputes unless told otherwise (Megatron-Core's default ``--recompute-modules``)
DEFAULT_MODULES = ("core_attn",)


@dataclass(frozen=True, kw_only=True)
class TensorParallel:
    """How a block is cut across the GPUs of one node."""

    t: int = 1  #: tensor-parallel degree
    sequence_parallel: bool = True  #: norms and dropouts split along the sequence (Korthikanti et al. 2022)
    overlap: bool = False  #: the collectives run in chunks behind the multiplies (AsyncTP, --tp-comm-overlap)


@dataclass(frozen=True, kw_only=True)
class ExpertParallel:
    """Where an MoE model's routed experts live: spread over ``ep`` groups of ``etp`` GPUs each among a
    stage's GPUs (``expert_parallel`` says how many nodes a group spans)."""

    ep: int = 1  #: expert-parallel degree: the routed experts of a block are split over this many
    nodes: int = 1  #: nodes one group spans; 1: its all-to-all stays on the node's link
    zero: bool = True  #: ZeRO-1: optimizer state sharded over the replicas (a routed expert's over its own)
    etp: int | None = None  #: expert tensor parallel: GPUs splitting each expert (None: t, as attention)


@dataclass(frozen=True, kw_only=True)
class Compute:
    """How the layers compute: the linear layers' precision and what "selective" recomputes."""

    precision: str = "bf16"  #: of ``hardware.PRECISIONS``
    modules: tuple[str, ...] = DEFAULT_MODULES  #: of ``activations.RECOMPUTE_MODULES``

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise PlanError(f"--precision {self.precision}: choose one of {', '.join(PRECISIONS)}")
        bad = [m for m in self.modules if m not in RECOMPUTE_MODULES]
        if bad or not self.modules:
            raise PlanError(f"--recompute-modules {','.join(self.modules)}: each must be one of "
                            f"{', '.join(RECOMPUTE_MODULES)}")


class _Ctx:
    """One profile's fixed inputs (a namespace, built once per call)."""

    def __init__(self, spec, hw, tp, recompute, expert, compute):
        self.spec, self.hw, self.tp, self.recompute, self.expert, self.compute = spec, hw, tp, recompute, expert, compute
        self.rate = hw.linear_rate(compute.precision)
        fp8 = compute.precision == "fp8"
        self.linear_factor = hw.fp8.activation_factor if fp8 else 1.0
        self.etp = tp.t if expert.etp is None else expert.etp


def block_activation_bytes(spec: TransformerSpec, b: int, tp: TensorParallel, recompute: str = "off",
                           kind: str = "t", modules=DEFAULT_MODULES, etp: int | None = None,
                           linear_factor: float = 1.0) -> float:
    """Bytes one block of ``kind`` keeps per micro-batch of ``b`` sequences on one GPU, by ``recompute``
    (``RECOMPUTE``; "selective" drops ``modules``' terms).

    For GPT (gelu, dropout, no flash) these are Korthikanti et al.'s Table 2: 34 s b h + 5 a s^2 b at
    t = 1; s b h (10 + 24/t + 5 a s / h t) with tensor parallel; s b h / t (34 + 5 a s / h) with sequence
    parallel too; selective drops the 5 a s^2 b term; full keeps the input only, 2 s b h (/ t with
    sequence parallel, whose input is scattered).
    """
    tokens = spec.seq * b
    if recompute == "full":
        return BF16 * tokens * spec.hidden / (tp.t if tp.sequence_parallel else 1)
    dropped = dropped_modules(spec, kind, modules) if recompute == "selective" else frozenset()
    return kept_bytes(spec, kind, tokens, tp.t, tp.sequence_parallel, dropped, etp, linear_factor)


def moe_activation_bytes(spec: TransformerSpec, b: int, tp: TensorParallel, recompute: str = "off", **kw) -> float:
    """Bytes an MoE block keeps per micro-batch on one GPU (``block_activation_bytes`` of kind "m")."""
    return block_activation_bytes(spec, b, tp, recompute, kind="m", **kw)


def score_bytes(spec: TransformerSpec, b: int) -> float:
    """Bytes of the attention core's s x s tensors kept for the backward at t = 1: softmax output (2),
    its dropout mask (1) and output (2), 5 a s^2 b; none with flash attention."""
    if spec.flash_attention:
        return 0.0
    return (2 + (3 if spec.dropout else 0)) * spec.heads * spec.seq * spec.seq * b


def boundary_bytes(spec: TransformerSpec, b: int, tp: TensorParallel) -> float:
    """Bytes of a block's output per GPU: what a stage sends on (Megatron scatters it over the t GPUs)."""
    return BF16 * spec.seq * b * spec.hidden / tp.t


def tp_allreduce_time(nbytes: float, t: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` among ``t`` GPUs of a node."""
    if t == 1:
        return 0.0
    return 2 * (t - 1) * link.latency + 2 * (t - 1) / t * nbytes / link.bandwidth


def exposed_tp(comm: float, mm: float, tp: TensorParallel) -> float:
    """Seconds of tensor-parallel collectives a block's compute waits for: all of ``comm``, or with
    ``tp.overlap`` its first of t chunks plus what the ``mm`` seconds of multiplies beside it cannot hide."""
    if not tp.overlap or tp.t == 1:
        return comm
    return comm / tp.t + max(0.0, comm * (tp.t - 1) / tp.t - mm)


def analytic_profile(spec: TransformerSpec, hw: Hardware, tp: TensorParallel,
                     micro_batch_sizes: tuple[int, ...] = (1, 2, 4), recompute: str = "off",
                     expert: ExpertParallel | None = None, compute: Compute | None = None) -> Profile:
    """The ``Profile`` of ``spec`` on one GPU of a ``tp.t``-way tensor-parallel group of ``hw``, its blocks
    recomputing as ``recompute`` says (``RECOMPUTE``). "full" checkpoints every block on its own, as
    Megatron-LM and torchtitan do: each keeps its input and replays its forward inside its backward (the
    one block being replayed is a transient, ``replay_bytes``); the embedding and the head keep theirs.

    Example:
        >>> from stagewise.plan.cluster.hardware import Hardware
        >>> p = analytic_profile(TransformerSpec.load("llama3-8b"), Hardware.load("h100"), TensorParallel(t=2))
        >>> len(p.layers), p.symbols[:2]
        (34, ('E', 't'))
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}; got {recompute!r}")
    ctx = _Ctx(spec, hw, tp, recompute, expert or ExpertParallel(), compute or Compute())
    blocks = [(spec.block_kind(i), spec.sliding(i)) for i in range(spec.layers)]
    kinds = [("E", False)] + blocks + [("H", False)]
    per = {b: {key: _layer(ctx, key, b) for key in dict.fromkeys(kinds)} for b in micro_batch_sizes}
    layers = []
    for k, key in enumerate(kinds):
        sym = key[0]
        vals = {name: tuple(per[b][key][name] for b in micro_batch_sizes) for name in per[micro_batch_sizes[0]][key]}
        dense, routed = _params(ctx, sym)
        e = ctx.expert
        # ZeRO-1 shards a routed expert's optimizer step over its replicas; the search divides by dp
        opt = dense + routed * (e.ep * ctx.etp / tp.t) if e.zero else dense + routed
        layers.append(LayerProfile(name="embedding" if sym == "E" else "head" if sym == "H" else f"block{k - 1}",
                                   symbol=sym, param_bytes=BF16 * (dense + routed), expert_param_bytes=BF16 * routed,
                                   t_opt=OPT_BYTES * opt / hw.memory_bandwidth, **vals))
    tied = (((0, len(kinds) - 1), BF16 * spec.vocab * spec.hidden / tp.t),) if spec.tied_embeddings else ()
    c = ctx.compute
    return Profile(model=spec.name, device=hw.name, micro_batch_sizes=tuple(micro_batch_sizes), layers=tuple(layers),
                   link=hw.intra, tied=tied,
                   meta={"analytic": True, "t": tp.t, "sequence_parallel": tp.sequence_parallel, "recompute": recompute,
                         "efficiency": hw.efficiency, "seq": spec.seq, "precision": c.precision,
                         "modules": list(c.modules), "async_tp": tp.overlap, "etp": ctx.etp})


def _params(ctx: _Ctx, sym: str) -> tuple[float, float]:
    """(dense, routed) parameters of one layer of kind ``sym`` on a GPU: the dense part cut by t (MLA's
    down-projections and the norms whole), the routed experts' ``experts / ep`` cut by etp."""
    spec, t = ctx.spec, ctx.tp.t
    emb = spec.vocab * spec.hidden
    if sym == "E":
        return emb / t, 0.0
    if sym == "H":  # the final norm, the output matrix (a tied copy is held too, and summed), the MTP modules
        dense, routed = _block_params(ctx, spec.mtp_kind)
        mtp = spec.mtp_layers
        return (spec.hidden + emb) / t + mtp * (dense + (3 * spec.hidden + 2 * spec.hidden ** 2) / t), mtp * routed
    return _block_params(ctx, sym)


def _block_params(ctx: _Ctx, kind: str) -> tuple[float, float]:
    spec, t = ctx.spec, ctx.tp.t
    whole = spec.attention_replicated_params() - 2 * spec.hidden  # MLA's down-projections (the norms as before)
    dense = spec.kind_params(kind, routed=False)
    routed = spec.moe.experts / ctx.expert.ep * spec.expert_params() / ctx.etp if kind == "m" else 0.0
    return (dense - whole) / t + whole, routed


def replay_bytes(spec: TransformerSpec, b: int, tp: TensorParallel, **kw) -> float:
    """With full recomputation: the activations of the one block being replayed for its backward (the
    largest kind's)."""
    kinds = {spec.block_kind(i) for i in range(spec.layers)}
    return max(block_activation_bytes(spec, b, tp, kind=k, **kw) for k in kinds)


def _layer(ctx: _Ctx, key: tuple[str, bool], b: int) -> dict:
    sym, sliding = key
    if sym == "E":
        return _embedding(ctx, b)
    if sym == "H":
        return _head(ctx, b)
    return _block(ctx, sym, b, sliding)


def _embedding(ctx: _Ctx, b: int) -> dict:
    """A gather forward, a scatter-add backward (memory-bound, tiny)."""
    spec, tp, hbm = ctx.spec, ctx.tp, ctx.hw.memory_bandwidth
    out_b = boundary_bytes(spec, b, tp)
    act = out_b + (spec.seq * b * spec.hidden / (tp.t if tp.sequence_parallel else 1) if spec.dropout else 0)
    return _times(f=act / hbm, i=0.0, w=2 * out_b / hbm, act=act, inp=0.0, out=out_b)


def _head(ctx: _Ctx, b: int) -> dict:
    """The final norm, the vocabulary-parallel output matrix and the cross-entropy over fp32 logits (in
    bf16: Megatron-Core keeps the output layer out of FP8), then each multi-token-prediction module."""
    spec, tp, hw = ctx.spec, ctx.tp, ctx.hw
    t, tokens, hbm = tp.t, spec.seq * b, hw.memory_bandwidth
    whole_out = BF16 * tokens * spec.hidden
    kept_input = boundary_bytes(spec, b, tp) if tp.sequence_parallel else whole_out
    h_mm = spec.head_flops(tokens) / t / hw.rate
    logits = 4 * tokens * spec.vocab / t
    act = kept_input + whole_out / (t if tp.sequence_parallel else 1) + logits
    ar = tp_allreduce_time(whole_out, t, hw.intra)
    out = _times(f=h_mm + act / hbm + ar, i=h_mm + 2 * act / hbm + ar, w=h_mm, act=act, inp=kept_input, out=0.0)
    if not spec.mtp_layers:
        return out
    last = spec.layers - 1
    block = _block(ctx, spec.mtp_kind, b, spec.sliding(last))
    proj = 2.0 * tokens * 2 * spec.hidden * spec.hidden / t / ctx.rate  # the 2h -> h projection
    # a module's norms and projection input (2 x 2h), its block's kept bytes, its own pass through the head
    extra = 2 * 2 * whole_out / (t if tp.sequence_parallel else 1) + block["activation_bytes"] + act
    mtp = spec.mtp_layers
    for key, add in (("t_f", block["t_f"] + proj + out["t_f"]), ("t_i", block["t_i"] + proj + out["t_i"]),
                     ("t_w", block["t_w"] + proj + out["t_w"]), ("activation_bytes", extra)):
        out[key] += mtp * add
    out["t_b"] = out["t_i"] + out["t_w"]
    if "a2a" in block:
        out["a2a"], out["a2a_b"] = mtp * block["a2a"], mtp * block["a2a_b"]
    return out


def _block(ctx: _Ctx, kind: str, b: int, sliding: bool) -> dict:
    """A block's F, I, W: its multiplies (linear layers at the precision's rate, MLA's down-projections
    whole), attention's products, the HBM bytes its element-wise passes move (the kept bytes without
    recomputation) and keep, the tensor-parallel collectives; an MoE block's all-to-all apart (``a2a``:
    dispatch + combine of a forward; the backward mirrors it, and a fully recomputed block replays its
    forward's too)."""
    spec, hw, tp, rc = ctx.spec, ctx.hw, ctx.tp, ctx.recompute
    t, tokens, hbm = tp.t, spec.seq * b, hw.memory_bandwidth
    modules = ctx.compute.modules
    mm_flops = spec.kind_matmul_flops(kind, tokens)
    routed = 2.0 * tokens * spec.moe.top_k * spec.expert_params() * spec.moe.load if kind == "m" else 0.0
    if kind == "m":  # the busiest rank's routed tokens, at the grouped multiplies' rate
        mm_flops -= 2.0 * tokens * spec.moe.top_k * spec.expert_params()
    down = 2.0 * tokens * (spec.attention_replicated_params() - spec.attention_norm_params())
    mm = (mm_flops - down) / t / ctx.rate + down / ctx.rate + routed / t / (ctx.rate * hw.expert_efficiency)
    block_index = next(i for i in range(spec.layers) if spec.block_kind(i) == kind and spec.sliding(i) == sliding) \
        if spec.layer_types else None
    # attention's two products are causal with flash attention (half the square computed)
    att = spec.attention_flops(tokens, block_index) * (0.5 if spec.flash_attention else 1.0) / t / hw.rate
    traffic = block_activation_bytes(spec, b, tp, "off", kind, etp=ctx.etp)
    if kind == "m":  # token permutation: each routed copy gathered into expert order and scattered back (r + w)
        traffic += 2 * 2 * BF16 * spec.hidden * tokens * spec.moe.top_k * spec.moe.load / t
    act = block_activation_bytes(spec, b, tp, rc, kind, modules, ctx.etp, ctx.linear_factor)
    dropped = dropped_modules(spec, kind, modules) if rc == "selective" else frozenset()
    # the backward's attention products: 2 x the forward's, + Q K^T again with flash attention (it keeps
    # no scores, which makes core_attn recomputation free), + the core's forward again (two products, the
    # scores written once more) when core_attn is recomputed without flash
    redo = 0.5 * att if spec.flash_attention else 0.0
    if "core_attn" in dropped:
        redo += att + score_bytes(spec, b) / t / hbm
    redo += (recompute_flops(spec, kind, tokens, dropped) / t / ctx.rate
             + recompute_traffic(spec, kind, tokens, t, tp.sequence_parallel, dropped) / hbm)
    comm = exposed_tp(2 * tp_allreduce_time(BF16 * tokens * spec.hidden, t, hw.intra), mm, tp)
    f = mm + att + traffic / hbm + comm
    i = mm + 2 * att + redo + 2 * traffic / hbm + comm + (f if rc == "full" else 0.0)
    out_b = boundary_bytes(spec, b, tp)
    out = _times(f=f, i=i, w=mm, act=act, inp=out_b if tp.sequence_parallel else BF16 * tokens * spec.hidden,
                 out=out_b)
    if kind == "m":
        moe = spec.moe
        a2a = (expert_a2a_time(spec, hw, tp, b, ctx.expert, moe.dispatch_bytes)
               + expert_a2a_time(spec, hw, tp, b, ctx.expert)) * moe.load
        out["a2a"], out["a2a_b"] = a2a, a2a * (2 if rc == "full" else 1)
    return out


def _times(*, f: float, i: float, w: float, act: float, inp: float, out: float) -> dict:
    return {"t_f": f, "t_b": i + w, "t_i": i, "t_w": w, "activation_bytes": act, "input_bytes": inp,
            "output_bytes": out}


def expert_a2a_time(spec: TransformerSpec, hw: Hardware, tp: TensorParallel, b: int, expert: ExpertParallel,
                    nbytes: float = BF16) -> float:
    """Seconds of one all-to-all of an MoE block (elements of ``nbytes``: the dispatch's, or the combine's
    bf16) for a micro-batch of ``b`` sequences on one GPU of a ``tp.t``-group (its share of the tokens),
    balanced (the caller scales by the busiest rank's load).

    Inside a node: each token goes once to every other GPU holding one of its experts (``costs.expert_copies``)
    over the node's link. Across ``expert.nodes`` nodes: once over InfiniBand to every other node holding
    one (at most ``moe.node_limit`` nodes in all), while NVLink forwards it on to the experts' GPUs there;
    the slower of the two sets the time. With expert tensor parallel (etp > 1: each expert cut over etp
    GPUs, Megatron-LM's default etp = t) the ``top_k`` routed copies a GPU receives are then gathered from
    (or reduced to) the other etp - 1 GPUs of its expert's group over the node's link, after (before) the
    exchange.
    """
    moe = spec.moe
    if moe is None or expert.ep == 1:
        return 0.0
    etp = tp.t if expert.etp is None else expert.etp
    token = spec.seq * b / tp.t * spec.hidden * nbytes  # bytes of one GPU's tokens
    gpus = expert_copies(moe.top_k, expert.ep, moe.experts // expert.ep)
    gather = (etp - 1) * (hw.intra.latency + moe.top_k * token / hw.intra.bandwidth) if etp > 1 else 0.0
    if expert.nodes == 1:
        return hw.intra.latency + token * gpus / hw.intra.bandwidth + gather
    n = expert.nodes
    nodes = expert_copies(moe.top_k, n, moe.experts // n)
    if moe.node_limit is not None:  # node-limited routing: the token's experts sit on at most node_limit nodes
        nodes = min(nodes, moe.node_limit * (n - 1) / n)
    return hw.inter.latency + max(token * nodes / hw.inter.bandwidth, token * gpus / hw.intra.bandwidth) + gather
