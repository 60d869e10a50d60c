"""An analytic profile: per-layer F, I, W times and bytes of a transformer on a GPU type, no measuring.

The result is an ordinary ``Profile`` (layers ``E``, ``t`` x L, ``H``), so the
partitioner, the schedules and the simulator treat it like a measured one.
Per GPU of a tensor-parallel group of ``t``:

- time of a matrix multiply = FLOPs / t / (peak x efficiency); I redoes the
  forward's multiplies on the input side and attention's two products twice,
  W redoes them on the weight side (Narayanan et al. 2021: backward = 2 x forward);
- element-wise work (norms, activations, softmax, dropout) is bound by HBM: the
  forward writes the bytes it keeps for the backward, the backward reads them and
  writes gradients of the same size (2x);
- tensor parallel puts two all-reduces of the block's output (2 s b h bytes) on
  the forward's critical path and two on the backward's (all-gather +
  reduce-scatter with sequence parallel: the same bytes), over the node's link;
- activation bytes follow Korthikanti et al. 2022 (arXiv:2205.05198, Sec. 4):
  34 s b h + 5 a s^2 b per block at t = 1 for GPT, generalised term by term to
  grouped-query attention, SwiGLU, no dropout and flash attention; with tensor
  parallel the norms' and dropouts' 10 s b h stay whole unless sequence parallel
  splits them too; a recomputed block keeps only its input (2 s b h);
- recomputation is one of ``RECOMPUTE``: "off"; "selective" (Korthikanti et al.
  Sec. 5: the attention core, Q K^T, softmax, its dropout and scores x V, is
  recomputed in the backward, so the 5 a s^2 b of scores is never kept, at the
  price of the core's two products and its element-wise passes once more in I);
  "full" (the whole block is replayed; the generic search's ``recompute``).
  Flash attention is selective recomputation by construction: it keeps no
  scores and its backward recomputes Q K^T (5 products where the forward has 2,
  not 4), so for a flash model "selective" is the same as "off";
- parameters are bf16 (2 bytes); the optimizer step streams fp32 master weights,
  Adam's two moments and the fp32 gradient through HBM (``OPT_BYTES`` per
  parameter), sharded over data parallel by the cluster search (ZeRO-1);
- a mixture-of-experts block (``TransformerSpec.moe``, symbol "m") is attention
  as above, a router, the shared experts and, per token, ``top_k`` routed
  experts' multiplies (balanced routing: each GPU of an ``ExpertParallel``
  group computes its own tokens' share), with the experts' kept activations in
  place of the dense MLP's; its routed experts are sharded over the group
  (``expert_param_bytes``), and each MoE block's dispatch and combine
  all-to-all (``expert_a2a_time``) is the profile's ``a2a``: NVLink when the
  group fits in a node, else InfiniBand once per remote node a token's experts
  sit on (at most ``node_limit``) with NVLink forwarding it inside that node,
  overlapped, as DeepSeek-V3's kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import expert_copies
from .hardware import Hardware
from .profile import LayerProfile, Link, Profile
from .transformer import TransformerSpec

BF16 = 2
#: bytes per parameter the optimizer step moves: fp32 master r/w (8), two fp32 moments r/w (16),
#: fp32 gradient read (4), bf16 weight written (2)
OPT_BYTES = 30
#: recomputation choices of the cluster search, least memory-saving first
RECOMPUTE = ("off", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class TensorParallel:
    """How a block is cut across the GPUs of one node."""

    t: int = 1  #: tensor-parallel degree
    sequence_parallel: bool = True  #: norms and dropouts split along the sequence (Korthikanti et al. 2022)


@dataclass(frozen=True, kw_only=True)
class ExpertParallel:
    """Where an MoE model's routed experts live: sharded over ``ep`` t-groups of a stage's data-parallel
    peers (``expert_parallel.placement`` says how many nodes the group spans)."""

    ep: int = 1  #: expert-parallel degree: the routed experts of a block are split over this many
    nodes: int = 1  #: nodes one group spans; 1: its all-to-all stays on the node's link
    zero: bool = True  #: ZeRO-1: optimizer state sharded over the replicas (a routed expert's over dp / ep)


def block_activation_bytes(spec: TransformerSpec, b: int, tp: TensorParallel, recompute: str = "off") -> float:
    """Bytes one block keeps per micro-batch of ``b`` sequences on one GPU, by ``recompute`` (``RECOMPUTE``).

    For GPT (gelu, dropout, no flash) these are Korthikanti et al.'s Table 2: 34 s b h + 5 a s^2 b at
    t = 1; s b h (10 + 24/t + 5 a s / h t) with tensor parallel; s b h / t (34 + 5 a s / h) with sequence
    parallel too; selective drops the 5 a s^2 b term; full keeps the input only, 2 s b h (/ t with
    sequence parallel, whose input is scattered).
    """
    s, h, f, t = spec.seq, spec.hidden, spec.ffn, tp.t
    sbh = s * b * h
    if recompute == "full":
        return BF16 * sbh / (t if tp.sequence_parallel else 1)
    # kept whole under tensor parallel: two norms' inputs, the QKV and MLP inputs, two dropout masks
    whole = 4 * sbh + 2 * sbh + 2 * sbh + (2 * sbh if spec.dropout else 0)
    # cut by t: Q, K, V, the output projection's input, the MLP's hidden tensors, the attention scores
    qkv = 2 * sbh + 4 * s * b * spec.kv_dim + 2 * sbh
    mlp = (6 if spec.mlp == "swiglu" else 4) * s * b * f
    split = qkv + mlp + (0 if recompute == "selective" else score_bytes(spec, b))
    return (whole + split) / t if tp.sequence_parallel else whole + split / t


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


def analytic_profile(spec: TransformerSpec, hw: Hardware, tp: TensorParallel,
                     micro_batch_sizes: tuple[int, ...] = (1, 2, 4), recompute: str = "off",
                     expert: ExpertParallel | None = None) -> Profile:
    """The ``Profile`` of ``spec`` on one GPU of a ``tp.t``-way tensor-parallel group of ``hw``, its blocks
    recomputing as ``recompute`` says (``RECOMPUTE``). "full" checkpoints every block on its own, as
    Megatron-LM and torchtitan do: each keeps its input and replays its forward inside its backward (the
    one block being replayed is a transient, ``replay_bytes``); the embedding and the head keep theirs.

    Example:
        >>> from stagewise.plan.hardware import Hardware
        >>> p = analytic_profile(TransformerSpec.load("llama3-8b"), Hardware.load("h100"), TensorParallel(t=2))
        >>> len(p.layers), p.symbols[:2]
        (34, ('E', 't'))
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}; got {recompute!r}")
    expert = expert or ExpertParallel()
    per = {b: _per_size(spec, hw, tp, b, recompute, expert) for b in micro_batch_sizes}
    kinds = ("E",) + ("t",) * (spec.layers - spec.moe_layers) + ("m",) * spec.moe_layers + ("H",)
    layers = []
    for k, sym in enumerate(kinds):
        vals = {name: tuple(per[b][sym][name] for b in micro_batch_sizes) for name in per[micro_batch_sizes[0]][sym]}
        params = _params(spec, sym, expert) / tp.t
        routed = _routed_params(spec, sym, expert) / tp.t
        # ZeRO-1 shards a routed expert's optimizer step over dp / ep replicas; the search divides by dp
        opt = params + routed * (expert.ep - 1) if expert.zero else params
        layers.append(LayerProfile(name="embedding" if sym == "E" else "head" if sym == "H" else f"block{k - 1}",
                                   symbol=sym, param_bytes=BF16 * params, expert_param_bytes=BF16 * routed,
                                   t_opt=OPT_BYTES * opt / hw.memory_bandwidth, **vals))
    tied = (((0, len(kinds) - 1), BF16 * spec.vocab * spec.hidden / tp.t),) if spec.tied_embeddings else ()
    return Profile(model=spec.name, device=hw.name, micro_batch_sizes=tuple(micro_batch_sizes), layers=tuple(layers),
                   link=hw.intra, tied=tied,
                   meta={"analytic": True, "t": tp.t, "sequence_parallel": tp.sequence_parallel, "recompute": recompute,
                         "efficiency": hw.efficiency, "seq": spec.seq})


def _params(spec: TransformerSpec, sym: str, expert: ExpertParallel = ExpertParallel()) -> float:
    """Parameters of one layer of kind ``sym`` on a GPU of an expert-parallel group (before tensor parallel)."""
    emb = spec.vocab * spec.hidden
    if sym == "E":
        return emb
    if sym == "H":  # the final norm and the output matrix (a tied copy is held too, and summed)
        return spec.hidden + emb
    if sym == "m":
        return spec.moe_block_params(routed=False) + _routed_params(spec, sym, expert)
    return spec.block_params()


def _routed_params(spec: TransformerSpec, sym: str, expert: ExpertParallel) -> float:
    """The routed experts' parameters a GPU of the group holds: its ``experts / ep`` of them."""
    return spec.moe.experts / expert.ep * spec.expert_params() if sym == "m" else 0.0


def replay_bytes(spec: TransformerSpec, b: int, tp: TensorParallel) -> float:
    """With full recomputation: the activations of the one block being replayed for its backward."""
    return block_activation_bytes(spec, b, tp)


def _per_size(spec: TransformerSpec, hw: Hardware, tp: TensorParallel, b: int, recompute: str,
              expert: "ExpertParallel | None" = None) -> dict:
    """Per-size values of the kinds of layer for micro-batch size ``b`` (and the MoE block's, "m")."""
    t, tokens, hbm = tp.t, spec.seq * b, hw.memory_bandwidth
    out_b = boundary_bytes(spec, b, tp)
    whole_out = BF16 * tokens * spec.hidden
    kept_input = out_b if tp.sequence_parallel else whole_out  # a recomputed block keeps its input
    mm = spec.block_matmul_flops(tokens) / t / hw.rate
    # element-wise passes move the same bytes either way (selective still writes the scores, only
    # drops them); what a block keeps is less
    block = _block(spec, hw, tp, b, recompute, mm, block_activation_bytes(spec, b, tp),
                   block_activation_bytes(spec, b, tp, recompute))
    # embedding: a gather forward, a scatter-add backward (memory-bound, tiny)
    e_act = out_b + (tokens * spec.hidden / (t if tp.sequence_parallel else 1) if spec.dropout else 0)
    emb = _times(f=e_act / hbm, i=0.0, w=2 * out_b / hbm, act=e_act, inp=0.0, out=out_b)
    # head: final norm, the vocabulary-parallel output matrix and the cross-entropy over fp32 logits
    h_mm = spec.head_flops(tokens) / t / hw.rate
    logits = 4 * tokens * spec.vocab / t
    h_act = kept_input + whole_out / (t if tp.sequence_parallel else 1) + logits
    head = _times(f=h_mm + h_act / hbm + tp_allreduce_time(whole_out, t, hw.intra),
                  i=h_mm + 2 * h_act / hbm + tp_allreduce_time(whole_out, t, hw.intra), w=h_mm,
                  act=h_act, inp=kept_input, out=0.0)
    out = {"E": emb, "t": block, "H": head}
    if spec.moe is not None:
        out["m"] = _moe_block(spec, hw, tp, b, recompute, expert)
    return out


def _block(spec: TransformerSpec, hw: Hardware, tp: TensorParallel, b: int, recompute: str, mm: float,
           traffic: float, act: float) -> dict:
    """A block's F, I, W from its matrix-multiply seconds ``mm``, the HBM bytes its element-wise passes
    move (``traffic``) and keep (``act``); attention and the tensor-parallel all-reduces are the spec's."""
    t, hbm = tp.t, hw.memory_bandwidth
    out_b = boundary_bytes(spec, b, tp)
    whole_out = BF16 * spec.seq * b * spec.hidden
    kept_input = out_b if tp.sequence_parallel else whole_out  # a recomputed block keeps its input
    # attention's two products are causal with flash attention (half the square computed)
    att = spec.attention_flops(spec.seq * b) * (0.5 if spec.flash_attention else 1.0) / t / hw.rate
    selective = recompute == "selective"
    # the backward's attention products: 2 x the forward's, + Q K^T again with flash attention (it keeps
    # no scores, which makes it selective already), + the core's forward again (two products, the
    # scores written once more) when selective
    if spec.flash_attention:
        redo = 0.5 * att
    else:
        redo = att + score_bytes(spec, b) / t / hbm if selective else 0.0
    comm = 2 * tp_allreduce_time(whole_out, t, hw.intra)
    f = mm + att + traffic / hbm + comm
    i = mm + 2 * att + redo + 2 * traffic / hbm + comm + (f if recompute == "full" else 0.0)
    return _times(f=f, i=i, w=mm, act=act, inp=kept_input, out=out_b)


def _times(*, f: float, i: float, w: float, act: float, inp: float, out: float) -> dict:
    return {"t_f": f, "t_b": i + w, "t_i": i, "t_w": w, "activation_bytes": act, "input_bytes": inp,
            "output_bytes": out}


def moe_activation_bytes(spec: TransformerSpec, b: int, tp: TensorParallel, recompute: str = "off") -> float:
    """Bytes an MoE block keeps per micro-batch on one GPU: the dense block's, less its MLP's hidden tensors,
    plus those of the ``top_k`` + shared experts each token passes and the routed copies of the experts'
    input (Korthikanti et al.'s terms, per expert pass)."""
    dense = block_activation_bytes(spec, b, tp, recompute)
    if recompute == "full":
        return dense  # only the block's input is kept
    moe, s = spec.moe, spec.seq * b
    per_f = 6 if spec.mlp == "swiglu" else 4  # bytes per token and unit of MLP width (see block_activation_bytes)
    delta = per_f * s * ((moe.top_k + moe.shared_experts) * moe.expert_ffn - spec.ffn) + moe.top_k * BF16 * s * spec.hidden
    return dense + delta / tp.t


def expert_a2a_time(spec: TransformerSpec, hw: Hardware, tp: TensorParallel, b: int, expert: ExpertParallel,
                    nbytes: float = BF16) -> float:
    """Seconds of one all-to-all of an MoE block (elements of ``nbytes``: the dispatch's, or the combine's
    bf16) for a micro-batch of ``b`` sequences on one GPU of a ``tp.t``-group (its share of the tokens).

    Inside a node: each token goes once to every other GPU holding one of its experts (``costs.expert_copies``)
    over the node's link. Across ``expert.nodes`` nodes: once over InfiniBand to every other node holding
    one (at most ``moe.node_limit`` nodes in all), while NVLink forwards it on to the experts' GPUs there;
    the slower of the two sets the time. With tensor parallel the experts are cut t ways too (Megatron-LM's
    expert tensor parallel = t): the ``top_k`` routed copies a GPU receives are then gathered from (or
    reduced to) the other t - 1 GPUs of its group over the node's link, after (before) the exchange.
    """
    moe = spec.moe
    if moe is None or expert.ep == 1:
        return 0.0
    t = tp.t
    token = spec.seq * b / t * spec.hidden * nbytes  # bytes of one GPU's tokens
    gpus = expert_copies(moe.top_k, expert.ep, moe.experts // expert.ep)
    etp = (t - 1) * (hw.intra.latency + moe.top_k * token / hw.intra.bandwidth) if t > 1 else 0.0
    if expert.nodes == 1:
        return hw.intra.latency + token * gpus / hw.intra.bandwidth + etp
    n = expert.nodes
    nodes = expert_copies(moe.top_k, n, moe.experts // n)
    if moe.node_limit is not None:  # node-limited routing: the token's experts sit on at most node_limit nodes
        nodes = min(nodes, moe.node_limit * (n - 1) / n)
    return hw.inter.latency + max(token * nodes / hw.inter.bandwidth, token * gpus / hw.intra.bandwidth) + etp


def _moe_block(spec: TransformerSpec, hw: Hardware, tp: TensorParallel, b: int, recompute: str,
               expert: ExpertParallel) -> dict:
    """An MoE block: attention, router, the shared and ``top_k`` routed experts' multiplies; its all-to-all
    apart (``a2a``: dispatch + combine of a forward; the backward mirrors it, and a fully recomputed block
    replays its forward's too)."""
    moe, tokens = spec.moe, spec.seq * b
    mm = spec.moe_block_matmul_flops(tokens) / tp.t / hw.rate
    out = _block(spec, hw, tp, b, recompute, mm, moe_activation_bytes(spec, b, tp),
                 moe_activation_bytes(spec, b, tp, recompute))
    a2a = expert_a2a_time(spec, hw, tp, b, expert, moe.dispatch_bytes) + expert_a2a_time(spec, hw, tp, b, expert)
    return {**out, "a2a": a2a, "a2a_b": a2a * (2 if recompute == "full" else 1)}
