"""The layer sequence of a causal LM: ``Embedding``, one ``Decoder`` per HF decoder layer, ``Head``.

Each wraps HF's own modules (the decoder layer is transformers' class itself),
so the arithmetic is transformers'. Only hidden states cross a stage boundary:
every ``Decoder`` makes its position ids, rotary tables and causal mask from the
hidden states' shape. They depend on nothing else (training batches are packed
sequences, no padding), cost ``T * head_dim`` numbers against a layer's
``T * hidden**2`` work, and so are cheaper to recompute than to send, keep
boundaries one tensor, and stay right under any schedule and recomputation.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch import nn


def modeling(model_type: str):
    """transformers' modeling module of ``model_type`` (imported on first use)."""
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


class Embedding(nn.Module):
    """Token ids (B, T) -> hidden states (B, T, d); GPT-2 adds learned positions and dropout."""

    def __init__(self, config: Any, gpt2: bool):
        super().__init__()
        if gpt2:
            self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
            self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
            self.drop = nn.Dropout(config.embd_pdrop)
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "embed_tokens"):
            return self.embed_tokens(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class Decoder(nn.Module):
    """One HF decoder layer; makes its position ids, rotary tables and causal mask per call."""

    def __init__(self, layer: nn.Module, config: Any, rotary: nn.Module | None, mask: Callable):
        super().__init__()
        self.layer = layer
        self.rotary = rotary  # no parameters; buffers only (inv_freq), not saved
        self.config = config
        self.mask = mask

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        extra = {} if self.rotary is None else {"position_embeddings": self.rotary(hidden, pos)}
        mask = self.mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                         position_ids=pos)
        out = self.layer(hidden, attention_mask=mask, position_ids=pos, **extra)
        return out[0] if isinstance(out, tuple) else out


class Head(nn.Module):
    """Final norm and LM head: hidden states -> logits (B, T, vocab)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear):
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


def make_layer(config: Any, prefix: str, i: int, device) -> nn.Module:
    """Layer ``i`` of ``E, t * L, H`` with uninitialised parameters on the meta device.

    ``prefix``: the modeling module's class prefix ("Llama", "GPT2", ...). The
    rotary module is made on ``device`` at once: its buffers are computed, not loaded.
    """
    layers = config.num_hidden_layers
    mod = modeling(config.model_type)
    gpt2 = prefix == "GPT2"
    with torch.device("meta"):
        if i == 0:
            return Embedding(config, gpt2)
        if i == layers + 1:
            norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon) if gpt2
                    else getattr(mod, f"{prefix}RMSNorm")(config.hidden_size, eps=config.rms_norm_eps))
            return Head(norm, nn.Linear(config.hidden_size, config.vocab_size, bias=False))
        block = getattr(mod, "GPT2Block" if gpt2 else f"{prefix}DecoderLayer")(config, layer_idx=i - 1)
    rotary = None
    if not gpt2:
        with torch.device(device):
            rotary = getattr(mod, f"{prefix}RotaryEmbedding")(config=config)
    return Decoder(block, config, rotary, _mask_function(config, i - 1))


def _mask_function(config: Any, k: int) -> Callable:
    """The mask HF's own model gives decoder layer ``k``: sliding window where its config says so."""
    from transformers import masking_utils

    if config.model_type == "mistral":  # no layer_types: its window, if any, applies to every layer
        sliding = getattr(config, "sliding_window", None) is not None
    else:
        kinds = getattr(config, "layer_types", None)
        sliding = bool(kinds) and kinds[k] == "sliding_attention"
    return masking_utils.create_sliding_window_causal_mask if sliding else masking_utils.create_causal_mask
