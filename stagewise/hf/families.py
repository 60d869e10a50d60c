"""Which transformers architectures the adapter covers, and the names of their parts (no torch here).

A causal LM of a covered family is cut into ``E, t * L, H``: the token
embedding (plus learned positions for GPT-2), the ``L`` decoder layers, and the
head (final norm and LM head). ``Family`` records where each part lives in the
HF model, so parameter names stay HF's own end to end.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import HFError


@dataclass(frozen=True, kw_only=True)
class Family:
    """The layout of one family's causal LM inside transformers."""

    name: str  #: "llama" or "gpt2": the builder module in stagewise.hf
    base: str  #: the base model's attribute: "model" (Llama) or "transformer" (GPT-2)
    embed: tuple[str, ...]  #: the embedding's parts under ``base``
    blocks: str  #: the decoder layer list under ``base``
    norm: str  #: the final norm under ``base``
    head: str = "lm_head"  #: the LM head, at the top level

    def prefixes(self, i: int, layers: int) -> dict[str, str]:
        """Layer ``i`` of ``E, t * layers, H``: its child module name -> the HF module path."""
        if i == 0:
            return {part: f"{self.base}.{part}" for part in self.embed}
        if i <= layers:
            return {"layer": f"{self.base}.{self.blocks}.{i - 1}"}
        return {"norm": f"{self.base}.{self.norm}", "lm_head": self.head}

    @property
    def embedding_weight(self) -> str:
        """The token embedding's HF name (the one a tied LM head shares)."""
        return f"{self.base}.{self.embed[0]}.weight"


LLAMA = Family(name="llama", base="model", embed=("embed_tokens",), blocks="layers", norm="norm")
GPT2 = Family(name="gpt2", base="transformer", embed=("wte", "wpe"), blocks="h", norm="ln_f")

#: config.model_type -> (family, the class-name prefix of its modeling module)
COVERED: dict[str, tuple[Family, str]] = {
    "llama": (LLAMA, "Llama"),
    "mistral": (LLAMA, "Mistral"),
    "qwen2": (LLAMA, "Qwen2"),
    "qwen3": (LLAMA, "Qwen3"),
    "gpt2": (GPT2, "GPT2"),
}


def family_of(model_type: str, architectures: list[str] | None = None) -> tuple[Family, str]:
    """The family of a config's ``model_type``; ``HFError`` naming it and the covered ones otherwise."""
    if model_type not in COVERED:
        arch = f" ({', '.join(architectures)})" if architectures else ""
        raise HFError(f"model_type {model_type!r}{arch} is not supported; stagewise.hf covers the Llama family "
                      "(llama, mistral, qwen2, qwen3) and gpt2")
    return COVERED[model_type]
