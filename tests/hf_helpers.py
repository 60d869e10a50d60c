"""Tiny Hugging Face causal LMs with random weights, saved to local folders (no hub access).

One per covered family: Llama (grouped-query attention: 4 heads, 2 kv heads),
Mistral (a sliding window shorter than the test sequences), Qwen2 (attention
biases, tied embedding), Qwen3 (q/k norms) and GPT-2 (learned positions, tied
embedding; dropout 0 so a training-mode run is deterministic).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SEQ = 16  #: tokens per test sequence
VOCAB = 256  #: byte-level tokens fit

_LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "llama": dict(model_type="llama", num_hidden_layers=3, **_LLAMA),
    "mistral": dict(model_type="mistral", num_hidden_layers=2, sliding_window=8, **_LLAMA),
    "qwen2": dict(model_type="qwen2", num_hidden_layers=2, tie_word_embeddings=True, **_LLAMA),
    "qwen3": dict(model_type="qwen3", num_hidden_layers=2, head_dim=32, **_LLAMA),
    "gpt2": dict(model_type="gpt2", vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64,
                 embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2),
}


def hf_config(kind: str, **over):
    from transformers import AutoConfig

    raw = {**CONFIGS[kind], **over}
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def save_tiny(kind: str, folder: Path, *, seed: int = 0, shard: str | None = None, **over) -> Path:
    """A tiny ``kind`` model with seeded random weights saved to ``folder`` (sharded when ``shard`` is a size)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind, **over))
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kw)
    return folder


def hf_model(folder: Path):
    """transformers' own model of ``folder``, in training mode (as a training loop uses it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).train()


def batch(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))


def write_config(path: Path, **raw) -> Path:
    path.write_text(json.dumps(raw))
    return path
