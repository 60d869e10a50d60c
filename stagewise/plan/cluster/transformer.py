"""A transformer as the analytic planner sees it, and the FLOPs and bytes of its parts.

Shipped descriptions (GPT-3 175B, the Megatron-LM SC21 Table 1 sizes up to 1T, Llama 3 8B/70B/405B,
Qwen3 dense and MoE, GPT-OSS, Mixtral, DeepSeek-V3) live in data/models/*.json with their sources.
FLOPs count a multiply-add as 2; bytes assume bf16 activations and weights.

Attention (``Attention``): ``heads`` query heads of ``head_dim`` (hidden / heads unless the file gives
it: Qwen3's 128 with hidden 2048 and 32 heads) and ``kv_heads`` key/value heads, or DeepSeek's
multi-head latent attention (``mla``: queries and keys/values projected down to low ranks and up again,
query-key heads of ``qk_nope_head_dim + qk_rope_head_dim``, value heads of ``v_head_dim``). A block's
attention sees the whole sequence, or the last ``sliding_window`` tokens where ``layer_types`` says
"sliding_attention" (GPT-OSS alternates the two).

A mixture-of-experts model (an ``moe`` object: ``MoE``) replaces the MLP of its MoE blocks with a
router, ``shared_experts`` that see every token and ``experts`` routed ones of which each token uses
``top_k``; an expert is an MLP of ``expert_ffn``. Which blocks are MoE is per index: all but the first
``dense_layers`` (DeepSeek-V3's ``first_k_dense_replace``), every ``every``-th (Qwen's
``decoder_sparse_step``), less the indices in ``dense`` (``mlp_only_layers``). Its parameters count every
expert, its FLOPs per token only the activated ones; ``imbalance`` (the busiest expert-parallel rank's
tokens over the mean) and ``capacity_factor`` (tokens past it are dropped, or with ``pad`` every expert
computes its full capacity) scale what the busiest rank computes and receives.

``mtp_layers`` multi-token-prediction modules (DeepSeek-V3's ``num_nextn_predict_layers``) follow the
last block: each has two norms, a 2h -> h projection and one block of the last block's kind, and shares
the embedding and the output head, whose multiply it runs once more.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import limits
from .datafile import SpecError, flag, label, number, read, whole

FORMAT = "stagewise-model"
_MLP_MATRICES = {"gelu": 2, "swiglu": 3}  #: weight matrices of hidden x ffn in the MLP
#: the attention of each block in ``layer_types`` (transformers' names)
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True, kw_only=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank query and key-value projections.

    Example:
        >>> TransformerSpec.load("deepseek-v3").mla.kv_lora_rank
        512
    """

    q_lora_rank: int | None  #: rank of the query's down-projection (None: queries projected directly)
    kv_lora_rank: int  #: rank of the compressed key-value latent
    qk_rope_head_dim: int  #: the rotary part of a query-key head (its key part shared by every head)
    qk_nope_head_dim: int  #: the part of a query-key head without position
    v_head_dim: int  #: a value head

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True)
class MoE:
    """The mixture-of-experts MLP of a model's MoE blocks.

    Example:
        >>> TransformerSpec.load("deepseek-v3").moe.experts
        256
    """

    experts: int  #: routed experts per MoE block (E)
    top_k: int  #: routed experts each token goes to (K)
    expert_ffn: int  #: hidden size of one expert's MLP
    shared_experts: int = 0  #: experts every token goes through, held whole on every rank of a stage
    dense_layers: int = 0  #: the first blocks keep a dense MLP of the model's ffn (DeepSeek-V3: 3)
    every: int = 1  #: every how many blocks one is MoE, counted from the first (Qwen's decoder_sparse_step)
    dense: tuple[int, ...] = ()  #: blocks (0-based) that keep a dense MLP whatever the rules above say
    #: most nodes one token's experts sit on (DeepSeek-V3's node-limited routing: 4); None: any
    node_limit: int | None = None
    dispatch_bytes: float = 2.0  #: bytes per element the dispatch sends (DeepSeek-V3: 1, FP8); the combine's are 2
    #: the busiest expert-parallel rank's routed tokens over the mean (1: balanced, as forced-balance benchmarks)
    imbalance: float = 1.0
    capacity_factor: float | None = None  #: an expert takes at most this x its mean tokens (None: dropless)
    pad: bool = False  #: with a capacity: every expert computes its whole capacity (padded)

    def is_moe(self, block: int) -> bool:
        """Whether block ``block`` (0-based) has the mixture of experts."""
        return (block >= self.dense_layers and (block - self.dense_layers) % self.every == 0
                and block not in self.dense)

    @property
    def load(self) -> float:
        """The busiest rank's routed tokens over the mean: the imbalance, capped (or padded) by the capacity."""
        if self.capacity_factor is None:
            return self.imbalance
        return self.capacity_factor if self.pad else min(self.imbalance, self.capacity_factor)


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """Shape of a decoder-only transformer.

    Example:
        >>> TransformerSpec.load("llama3-405b").layers
        126
        >>> q = TransformerSpec.load("qwen3-30b-a3b")
        >>> q.head_size, q.q_dim, q.hidden
        (128, 4096, 2048)
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int  #: grouped-query attention: key/value heads (= heads without GQA)
    ffn: int
    vocab: int
    seq: int
    mlp: str = "gelu"  #: gelu (two matrices) or swiglu (three)
    tied_embeddings: bool = False  #: the head reuses the input embedding (its gradient is summed across stages)
    dropout: bool = False  #: dropout masks are kept for the backward (1 byte per element)
    flash_attention: bool = True  #: attention scores are never stored (False: Megatron 2021's s^2 softmax)
    moe: MoE | None = None  #: the MoE blocks' experts; None: a dense model
    head_dim: int | None = None  #: a query (and key/value) head; None: hidden / heads
    mla: MLA | None = None  #: multi-head latent attention in place of the q/k/v projections
    mtp_layers: int = 0  #: multi-token-prediction modules after the last block (DeepSeek-V3: 1)
    sliding_window: int | None = None  #: tokens a "sliding_attention" block attends to
    #: per block, "full_attention" or "sliding_attention" (None: every block full)
    layer_types: tuple[str, ...] | None = None

    # ---- attention shapes

    @property
    def head_size(self) -> int:
        """A query head's size (``head_dim``, or hidden / heads)."""
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the queries of all heads (MLA: query-key heads)."""
        return self.heads * (self.mla.qk_head_dim if self.mla else self.head_size)

    @property
    def kv_dim(self) -> int:
        """Width of the keys (or of the values) of all key/value heads (MLA: of the keys)."""
        return self.heads * self.mla.qk_head_dim if self.mla else self.kv_heads * self.head_size

    @property
    def v_dim(self) -> int:
        """Width of the values of all heads: what the output projection reads."""
        return self.heads * (self.mla.v_head_dim if self.mla else self.head_size)

    def attention_replicated_params(self) -> int:
        """Weights of the attention that every tensor-parallel rank holds whole: MLA's down-projections and
        their norms (Megatron-Core duplicates them), the block's two norms."""
        norms = 2 * self.hidden
        if self.mla is None:
            return norms
        m = self.mla
        down = self.hidden * ((m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim)
        return norms + down + (m.q_lora_rank or 0) + m.kv_lora_rank

    def attention_params(self) -> int:
        """Weights of a block's attention projections and its two norms."""
        h = self.hidden
        if self.mla is None:
            return h * self.q_dim + 2 * h * self.kv_dim + self.v_dim * h + 2 * h
        m = self.mla
        q_up = (m.q_lora_rank or h) * self.q_dim  # without a q rank the queries come straight from hidden
        kv_up = m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim)
        down = self.attention_replicated_params() - 2 * h - (m.q_lora_rank or 0) - m.kv_lora_rank
        norms = 2 * h + (m.q_lora_rank or 0) + m.kv_lora_rank
        return down + q_up + kv_up + self.v_dim * h + norms

    def attention_norm_params(self) -> int:
        """Of ``attention_params``, the norms' weights (no multiply)."""
        m = self.mla
        return 2 * self.hidden + (((m.q_lora_rank or 0) + m.kv_lora_rank) if m else 0)

    def up_projection_flops(self, tokens: int) -> float:
        """MLA: forward FLOPs of the up-projections (``mla_up_proj``), which selective recomputation redoes."""
        m = self.mla
        if m is None:
            return 0.0
        return 2.0 * tokens * ((m.q_lora_rank or 0) * self.q_dim
                               + m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim))

    def sliding(self, block: int) -> bool:
        """Whether block ``block`` attends to a sliding window."""
        return self.layer_types is not None and self.layer_types[block] == "sliding_attention"

    def attention_flops(self, tokens: int, block: int | None = None) -> float:
        """Forward FLOPs of Q K^T and scores x V over full seq x seq (the papers' count); a sliding block's
        over twice its window, so that the causal half (flash attention) is the window."""
        context = self.seq
        if block is not None and self.sliding(block):
            context = min(self.seq, 2 * self.sliding_window)
        return 2.0 * tokens * context * (self.q_dim + self.v_dim)

    # ---- blocks

    def block_kind(self, block: int) -> str:
        """"m" for an MoE block, "t" for a dense one."""
        return "m" if self.moe is not None and self.moe.is_moe(block) else "t"

    @property
    def moe_layers(self) -> int:
        """Blocks whose MLP is the mixture of experts (0 for a dense model)."""
        return sum(self.block_kind(i) == "m" for i in range(self.layers)) if self.moe else 0

    def block_params(self) -> int:
        """Weights of one dense block: attention projections, MLP, two norms."""
        return self.attention_params() + _MLP_MATRICES[self.mlp] * self.hidden * self.ffn

    def expert_params(self) -> int:
        """Weights of one expert's MLP."""
        return _MLP_MATRICES[self.mlp] * self.hidden * self.moe.expert_ffn if self.moe else 0

    def moe_block_params(self, routed: bool = True) -> int:
        """Weights of one MoE block: attention, router, shared experts and (``routed``) every routed expert."""
        moe = self.moe
        router = moe.experts * self.hidden
        return (self.attention_params() + router
                + (moe.shared_experts + (moe.experts if routed else 0)) * self.expert_params())

    def kind_params(self, kind: str, routed: bool = True) -> int:
        return self.moe_block_params(routed) if kind == "m" else self.block_params()

    @property
    def mtp_kind(self) -> str:
        """The kind of a multi-token-prediction module's block: the last block's."""
        return self.block_kind(self.layers - 1)

    def mtp_params(self) -> int:
        """Weights of the multi-token-prediction modules (two norms, the 2h -> h projection, a block, the
        final norm each); they share the embedding and the head."""
        h = self.hidden
        return self.mtp_layers * (3 * h + 2 * h * h + self.kind_params(self.mtp_kind))

    def params(self) -> int:
        """All weights (the embedding once when tied), the multi-token-prediction modules included."""
        emb = self.vocab * self.hidden
        blocks = sum(self.kind_params(self.block_kind(i)) for i in range(self.layers))
        return blocks + self.mtp_params() + emb * (1 if self.tied_embeddings else 2) + self.hidden

    def block_matmul_flops(self, tokens: int) -> float:
        """Forward FLOPs of a dense block's weight matrices for ``tokens`` tokens."""
        return 2.0 * tokens * (self.block_params() - self.attention_norm_params())

    def moe_block_matmul_flops(self, tokens: int) -> float:
        """Forward FLOPs of an MoE block's weight matrices for ``tokens`` tokens: attention, router and the
        ``top_k`` + shared experts each token goes through (balanced: the mean rank's)."""
        active = self.moe_block_params(routed=False) + self.moe.top_k * self.expert_params()
        return 2.0 * tokens * (active - self.attention_norm_params())

    def kind_matmul_flops(self, kind: str, tokens: int) -> float:
        return self.moe_block_matmul_flops(tokens) if kind == "m" else self.block_matmul_flops(tokens)

    def head_flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.hidden * self.vocab

    def mtp_flops(self, tokens: int) -> float:
        """Forward FLOPs of the multi-token-prediction modules: projection, block, attention and the head."""
        if not self.mtp_layers:
            return 0.0
        last = self.layers - 1
        one = (2.0 * tokens * 2 * self.hidden * self.hidden + self.kind_matmul_flops(self.mtp_kind, tokens)
               + self.attention_flops(tokens, last) + self.head_flops(tokens))
        return self.mtp_layers * one

    def model_flops_per_token(self) -> float:
        """Forward + backward FLOPs per token without recomputation (what MFU counts), the
        multi-token-prediction modules' included."""
        blocks = sum(self.kind_matmul_flops(self.block_kind(i), 1) + self.attention_flops(1, i)
                     for i in range(self.layers))
        return 3.0 * (blocks + self.head_flops(1) + self.mtp_flops(1))

    @staticmethod
    def load(ref: str, option: str = "--model") -> "TransformerSpec":
        """A shipped name (``llama3-405b``) or a path to a model JSON file."""
        data, where = read(ref, "models", option, FORMAT)
        return from_json(data, where)


#: the largest value of each shape field: the planner's FLOPs and bytes stay finite far beyond any model
#: (layers go through ``limits.LAYERS``: the profile holds one entry per layer)
_MAXIMUM = {"hidden": 2**20, "heads": 2**16, "kv_heads": 2**16, "ffn": 2**22, "vocab": 2**24, "seq": 2**24,
            "head_dim": 2**14, "mtp_layers": 16, "sliding_window": 2**24}
_FIELDS = ("format", "version", "name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq", "mlp",
           "tied_embeddings", "dropout", "flash_attention", "moe", "head_dim", "mla", "mtp_layers",
           "sliding_window", "layer_types", "source", "sources", "description")


def from_json(data: dict, where: str) -> TransformerSpec:
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:  # a typo (``head_size``) would be silently off
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS[2:])}")
    ints = {k: number(data, k, where, integer=True, maximum=_MAXIMUM.get(k)) for k in
            ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")}
    try:
        limits.LAYERS.check(ints["layers"], "", detail=f"{where}: layers {ints['layers']}")
    except limits.LimitError as e:
        raise SpecError(str(e)) from None
    mlp = data.get("mlp", "gelu")
    if not isinstance(mlp, str) or mlp not in _MLP_MATRICES:
        raise SpecError(f"{where}: mlp must be one of {', '.join(_MLP_MATRICES)}; got {str(mlp)[:40]!r}")
    head_dim = _optional_int(data, "head_dim", where)
    if head_dim is None and data.get("mla") is None and ints["hidden"] % ints["heads"]:
        raise SpecError(f"{where}: hidden ({ints['hidden']}) must be a multiple of heads ({ints['heads']}), or "
                        "give head_dim (a query head's size)")
    if ints["kv_heads"] > ints["heads"] or ints["heads"] % ints["kv_heads"]:
        raise SpecError(f"{where}: kv_heads ({ints['kv_heads']}) must divide heads ({ints['heads']})")
    flags = {k: flag(data, k, where) if k in data else default
             for k, default in (("tied_embeddings", False), ("dropout", False), ("flash_attention", True))}
    moe = _moe(data["moe"], f"{where}: moe", ints["layers"]) if data.get("moe") is not None else None
    mla = _mla(data["mla"], f"{where}: mla") if data.get("mla") is not None else None
    window, types = _sliding(data, where, ints["layers"])
    return TransformerSpec(name=label(data, "name", where, where), mlp=mlp, moe=moe, head_dim=head_dim, mla=mla,
                           mtp_layers=whole(data, "mtp_layers", where, default=0, maximum=_MAXIMUM["mtp_layers"]),
                           sliding_window=window,
                           layer_types=types, **ints, **flags)


def _optional_int(data: dict, key: str, where: str) -> int | None:
    if data.get(key) is None:
        return None
    return number(data, key, where, integer=True, maximum=_MAXIMUM.get(key))


def _sliding(data: dict, where: str, layers: int) -> tuple[int | None, tuple[str, ...] | None]:
    """``sliding_window`` and ``layer_types`` (one of ``LAYER_TYPES`` per block), checked together."""
    window = _optional_int(data, "sliding_window", where)
    raw = data.get("layer_types")
    if raw is None:
        return window, None
    if not isinstance(raw, list) or len(raw) != layers or any(x not in LAYER_TYPES for x in raw):
        raise SpecError(f"{where}: layer_types must be a list of {layers} entries (one per layer), each one of "
                        f"{', '.join(LAYER_TYPES)}; got {str(raw)[:60]}")
    if "sliding_attention" in raw and window is None:
        raise SpecError(f"{where}: layer_types has sliding_attention blocks: give sliding_window (tokens)")
    return window, tuple(raw)


_MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


def _mla(raw, where: str) -> MLA:
    """The ``mla`` object (transformers' DeepSeek-V3 names); ``q_lora_rank`` null: no query down-projection."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be an object {{\"kv_lora_rank\": R, \"qk_rope_head_dim\": D, ...}}; got {raw!r}")
    unknown = sorted(set(raw) - set(_MLA_FIELDS))
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(_MLA_FIELDS)}")
    ints = {k: number(raw, k, where, integer=True, maximum=2**16) for k in _MLA_FIELDS[1:]}
    q = number(raw, "q_lora_rank", where, integer=True, maximum=2**16) if raw.get("q_lora_rank") is not None else None
    return MLA(q_lora_rank=q, **ints)


_MOE_FIELDS = ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "every", "dense", "node_limit",
               "dispatch_bytes", "imbalance", "capacity_factor", "pad")


def _moe(raw, where: str, layers: int) -> MoE:
    """The ``moe`` object, every field checked; an unknown one is refused (a typo would be silently off)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be an object {{\"experts\": E, \"top_k\": K, \"expert_ffn\": F, ...}}; "
                        f"got {raw!r}")
    unknown = sorted(set(raw) - set(_MOE_FIELDS))
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(_MOE_FIELDS)}")
    ints = {k: number(raw, k, where, integer=True, maximum=_MAXIMUM["ffn"] if k == "expert_ffn" else None)
            for k in ("experts", "top_k", "expert_ffn")}
    try:  # ep degrees are the experts' divisors: a count past the limit is refused before any search
        limits.EXPERTS.check(ints["experts"], "", detail=f"{where}: experts {ints['experts']}")
    except limits.LimitError as e:
        raise SpecError(str(e)) from None
    for k in ("shared_experts", "dense_layers"):  # as many shared experts as routed ones at most; dense: < layers
        ints[k] = whole(raw, k, where, default=0, maximum=limits.EXPERTS.value if k == "shared_experts" else None)
    if ints["top_k"] > ints["experts"]:
        raise SpecError(f"{where}: top_k ({ints['top_k']}) must be at most experts ({ints['experts']})")
    if ints["dense_layers"] >= layers:
        raise SpecError(f"{where}: dense_layers ({ints['dense_layers']}) must be fewer than layers ({layers})")
    every = number(raw, "every", where, integer=True, maximum=limits.LAYERS.value) if "every" in raw else 1
    dense = raw.get("dense", [])
    if not isinstance(dense, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers
                                          for i in dense):
        raise SpecError(f"{where}: dense must be a list of block indices from 0 to {layers - 1}; got {str(dense)[:60]}")
    limit = (number(raw, "node_limit", where, integer=True, maximum=limits.GPUS.value)
             if raw.get("node_limit") is not None else None)
    nbytes = number(raw, "dispatch_bytes", where, maximum=4) if "dispatch_bytes" in raw else 2.0
    imbalance = number(raw, "imbalance", where, minimum=1.0, maximum=64.0) if "imbalance" in raw else 1.0
    cap = (number(raw, "capacity_factor", where, maximum=64.0) if raw.get("capacity_factor") is not None else None)
    pad = flag(raw, "pad", where) if "pad" in raw else False
    if pad and cap is None:
        raise SpecError(f"{where}: pad pads every expert to its capacity: give capacity_factor too")
    moe = MoE(node_limit=limit, dispatch_bytes=nbytes, every=every, dense=tuple(sorted(set(dense))),
              imbalance=imbalance, capacity_factor=cap, pad=pad, **ints)
    if not any(moe.is_moe(i) for i in range(layers)):
        raise SpecError(f"{where}: no block is MoE (dense_layers {moe.dense_layers}, every {every}, dense "
                        f"{list(moe.dense)}); drop the moe object for a dense model")
    return moe
