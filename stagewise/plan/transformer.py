"""A transformer as the analytic planner sees it, and the FLOPs and bytes of its parts.

Shipped descriptions (GPT-3 175B, the Megatron-LM SC21 Table 1 sizes up to 1T,
Llama 3 8B/70B/405B, DeepSeek-V3) live in data/models/*.json with their sources.
FLOPs count a multiply-add as 2; bytes assume bf16 activations and weights.

A mixture-of-experts model (an ``moe`` object in its file: ``MoE``) replaces the
MLP of every block after its ``dense_layers`` with a router, ``shared_experts``
that see every token and ``experts`` routed ones of which each token uses
``top_k``; an expert is an MLP of ``expert_ffn``. Its parameters count every
expert; its FLOPs per token only the activated ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import limits
from .datafile import SpecError, flag, label, number, read, whole

FORMAT = "stagewise-model"
_MLP_MATRICES = {"gelu": 2, "swiglu": 3}  #: weight matrices of hidden x ffn in the MLP


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
    #: most nodes one token's experts sit on (DeepSeek-V3's node-limited routing: 4); None: any
    node_limit: int | None = None
    dispatch_bytes: float = 2.0  #: bytes per element the dispatch sends (DeepSeek-V3: 1, FP8); the combine's are 2


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """Shape of a decoder-only transformer.

    Example:
        >>> TransformerSpec.load("llama3-405b").layers
        126
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

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def moe_layers(self) -> int:
        """Blocks whose MLP is the mixture of experts (0 for a dense model)."""
        return self.layers - self.moe.dense_layers if self.moe else 0

    def attention_params(self) -> int:
        """Weights of a block's attention projections and its two norms."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_dim + 2 * h

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

    def params(self) -> int:
        """All weights (the embedding once when tied)."""
        emb = self.vocab * self.hidden
        dense = (self.layers - self.moe_layers) * self.block_params()
        moe = self.moe_layers * self.moe_block_params() if self.moe else 0
        return dense + moe + emb * (1 if self.tied_embeddings else 2) + self.hidden

    def block_matmul_flops(self, tokens: int) -> float:
        """Forward FLOPs of a dense block's weight matrices for ``tokens`` tokens."""
        return 2.0 * tokens * (self.block_params() - 2 * self.hidden)

    def moe_block_matmul_flops(self, tokens: int) -> float:
        """Forward FLOPs of an MoE block's weight matrices for ``tokens`` tokens: attention, router and the
        ``top_k`` + shared experts each token goes through."""
        active = self.moe_block_params(routed=False) + self.moe.top_k * self.expert_params()
        return 2.0 * tokens * (active - 2 * self.hidden)

    def attention_flops(self, tokens: int) -> float:
        """Forward FLOPs of Q K^T and scores x V over full seq x seq (the papers' count)."""
        return 4.0 * tokens * self.seq * self.hidden

    def head_flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.hidden * self.vocab

    def model_flops_per_token(self) -> float:
        """Forward + backward FLOPs per token without recomputation (what MFU counts)."""
        dense = (self.layers - self.moe_layers) * self.block_matmul_flops(1)
        moe = self.moe_layers * self.moe_block_matmul_flops(1) if self.moe else 0.0
        return 3.0 * (dense + moe + self.layers * self.attention_flops(1) + self.head_flops(1))

    @staticmethod
    def load(ref: str, option: str = "--model") -> "TransformerSpec":
        """A shipped name (``llama3-405b``) or a path to a model JSON file."""
        data, where = read(ref, "models", option, FORMAT)
        return from_json(data, where)


#: the largest value of each shape field: the planner's FLOPs and bytes stay finite far beyond any model
#: (layers go through ``limits.LAYERS``: the profile holds one entry per layer)
_MAXIMUM = {"hidden": 2**20, "heads": 2**16, "kv_heads": 2**16, "ffn": 2**22, "vocab": 2**24, "seq": 2**24}


def from_json(data: dict, where: str) -> TransformerSpec:
    ints = {k: number(data, k, where, integer=True, maximum=_MAXIMUM.get(k)) for k in
            ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")}
    try:
        limits.LAYERS.check(ints["layers"], "", detail=f"{where}: layers {ints['layers']}")
    except limits.LimitError as e:
        raise SpecError(str(e)) from None
    mlp = data.get("mlp", "gelu")
    if not isinstance(mlp, str) or mlp not in _MLP_MATRICES:
        raise SpecError(f"{where}: mlp must be one of {', '.join(_MLP_MATRICES)}; got {str(mlp)[:40]!r}")
    if ints["hidden"] % ints["heads"]:
        raise SpecError(f"{where}: hidden ({ints['hidden']}) must be a multiple of heads ({ints['heads']})")
    if ints["kv_heads"] > ints["heads"] or ints["heads"] % ints["kv_heads"]:
        raise SpecError(f"{where}: kv_heads ({ints['kv_heads']}) must divide heads ({ints['heads']})")
    flags = {k: flag(data, k, where) if k in data else default
             for k, default in (("tied_embeddings", False), ("dropout", False), ("flash_attention", True))}
    moe = _moe(data["moe"], f"{where}: moe", ints["layers"]) if data.get("moe") is not None else None
    return TransformerSpec(name=label(data, "name", where, where), mlp=mlp, moe=moe, **ints, **flags)


_MOE_FIELDS = ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "node_limit", "dispatch_bytes")


def _moe(raw, where: str, layers: int) -> MoE:
    """The ``moe`` object, every field checked; an unknown one is refused (a typo would be silently off)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be an object {{\"experts\": E, \"top_k\": K, \"expert_ffn\": F, ...}}; "
                        f"got {raw!r}")
    unknown = sorted(set(raw) - set(_MOE_FIELDS))
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(_MOE_FIELDS)}")
    ints = {k: number(raw, k, where, integer=True) for k in ("experts", "top_k", "expert_ffn")}
    try:  # ep degrees are the experts' divisors: a count past the limit is refused before any search
        limits.EXPERTS.check(ints["experts"], "", detail=f"{where}: experts {ints['experts']}")
    except limits.LimitError as e:
        raise SpecError(str(e)) from None
    for k in ("shared_experts", "dense_layers"):
        ints[k] = whole(raw, k, where, default=0)
    if ints["top_k"] > ints["experts"]:
        raise SpecError(f"{where}: top_k ({ints['top_k']}) must be at most experts ({ints['experts']})")
    if ints["dense_layers"] >= layers:
        raise SpecError(f"{where}: dense_layers ({ints['dense_layers']}) must be fewer than layers ({layers})")
    limit = number(raw, "node_limit", where, integer=True) if raw.get("node_limit") is not None else None
    nbytes = number(raw, "dispatch_bytes", where, maximum=4) if "dispatch_bytes" in raw else 2.0
    return MoE(node_limit=limit, dispatch_bytes=nbytes, **ints)
