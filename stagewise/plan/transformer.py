"""A dense transformer as the analytic planner sees it, and the FLOPs and bytes of its parts.

Shipped descriptions (GPT-3 175B, the Megatron-LM SC21 Table 1 sizes up to 1T,
Llama 3 8B/70B/405B) live in data/models/*.json with their sources.
FLOPs count a multiply-add as 2; bytes assume bf16 activations and weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import limits
from .datafile import SpecError, flag, label, number, read

FORMAT = "stagewise-model"
_MLP_MATRICES = {"gelu": 2, "swiglu": 3}  #: weight matrices of hidden x ffn in the MLP


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

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    def block_params(self) -> int:
        """Weights of one block: attention projections, MLP, two norms."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_dim + _MLP_MATRICES[self.mlp] * h * self.ffn + 2 * h

    def params(self) -> int:
        """All weights (the embedding once when tied)."""
        emb = self.vocab * self.hidden
        return self.layers * self.block_params() + emb * (1 if self.tied_embeddings else 2) + self.hidden

    def block_matmul_flops(self, tokens: int) -> float:
        """Forward FLOPs of a block's weight matrices for ``tokens`` tokens."""
        return 2.0 * tokens * (self.block_params() - 2 * self.hidden)

    def attention_flops(self, tokens: int) -> float:
        """Forward FLOPs of Q K^T and scores x V over full seq x seq (the papers' count)."""
        return 4.0 * tokens * self.seq * self.hidden

    def head_flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.hidden * self.vocab

    def model_flops_per_token(self) -> float:
        """Forward + backward FLOPs per token without recomputation (what MFU counts)."""
        one = self.block_matmul_flops(1) + self.attention_flops(1)
        return 3.0 * (self.layers * one + self.head_flops(1))

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
    return TransformerSpec(name=label(data, "name", where, where), mlp=mlp, **ints, **flags)
