"""Which transformers architectures the adapter covers, and the names of their parts (no torch here).

A causal LM of a covered family is the layer sequence ``E, t * L, N, H``: the
token embedding (plus learned positions for GPT-2), the ``L`` decoder layers,
the final norm and the LM head. ``Family`` records where each layer lives in
the HF model, so parameter names stay HF's own end to end. The mixtures of
experts (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) have the Llama layout; a
decoder layer whose MLP is a sparse MoE block is an ``m`` (``moe_layer`` says
which, by each family's own rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .errors import HFError


@dataclass(frozen=True, kw_only=True)
class Family:
    """Where each layer of the sequence lives in the HF model (its state_dict prefix)."""

    name: str  #: "llama" or "gpt2"
    embedding: str  #: layer 0's prefix: the embedding module ("model.embed_tokens") or its parent ("transformer")
    token_weight: str  #: the token embedding's full name (what a tied LM head shares)
    blocks: str  #: the decoder layer list ("model.layers")
    norm: str  #: the final norm ("model.norm")
    head: str = "lm_head"  #: the LM head

    @property
    def base(self) -> str:
        """The base model's attribute ("model", "transformer"): original GPT-2 files store names without it."""
        return self.blocks.split(".")[0]

    def prefix(self, i: int, layers: int) -> str:
        """Layer ``i`` of embedding, ``layers`` decoder layers, norm, head: its prefix in HF's state_dict."""
        if i == 0:
            return self.embedding
        if i <= layers:
            return f"{self.blocks}.{i - 1}"
        return self.norm if i == layers + 1 else self.head


LLAMA = Family(name="llama", embedding="model.embed_tokens", token_weight="model.embed_tokens.weight",
               blocks="model.layers", norm="model.norm")
GPT2 = Family(name="gpt2", embedding="transformer", token_weight="transformer.wte.weight", blocks="transformer.h",
              norm="transformer.ln_f")

#: config.model_type -> (family, the class-name prefix of its modeling module)
COVERED: dict[str, tuple[Family, str]] = {
    "llama": (LLAMA, "Llama"),
    "mistral": (LLAMA, "Mistral"),
    "qwen2": (LLAMA, "Qwen2"),
    "qwen3": (LLAMA, "Qwen3"),
    "gpt2": (GPT2, "GPT2"),
    "mixtral": (LLAMA, "Mixtral"),
    "qwen2_moe": (LLAMA, "Qwen2Moe"),
    "qwen3_moe": (LLAMA, "Qwen3Moe"),
    "deepseek_v3": (LLAMA, "DeepseekV3"),
}

#: the mixture-of-experts families (each has a sparse MoE block in some decoder layers)
MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")


def moe_layer(model_type: str, k: int, get: Callable[[str], Any]) -> bool:
    """Whether decoder layer ``k`` (0-based) has the sparse MoE block, by the family's rule (as its decoder layer's
    ``__init__`` decides); ``get(field)`` reads the config (the file's value or transformers' default)."""
    if model_type == "mixtral":
        return True
    if model_type in ("qwen2_moe", "qwen3_moe"):
        step = get("decoder_sparse_step") or 1
        return k not in (get("mlp_only_layers") or ()) and (get("num_experts") or 0) > 0 and (k + 1) % step == 0
    if model_type == "deepseek_v3":
        return k >= (get("first_k_dense_replace") or 0)
    return False


def family_of(model_type: str, architectures: list[str] | None = None) -> tuple[Family, str]:
    """The family of a config's ``model_type``; ``HFError`` naming it and the covered ones otherwise."""
    if not isinstance(model_type, str) or model_type not in COVERED:
        arch = f" ({', '.join(map(str, architectures))})" if architectures else ""
        raise HFError(f"model_type {model_type!r:.60}{arch:.200} is not supported; stagewise.hf covers the Llama family "
                      "(llama, mistral, qwen2, qwen3), gpt2 and the mixtures of experts mixtral, qwen2_moe, qwen3_moe "
                      "and deepseek_v3")
    return COVERED[model_type]
