"""The layer sequence of a causal LM: embedding, each decoder layer, final norm, LM head.

Every layer's parameter names, behind its prefix (``Family.prefix``), are HF's
own: the Llama embedding *is* ``model.embed_tokens``, the norm *is*
``model.norm``, the head *is* ``lm_head``, and a decoder layer is transformers'
own class with a one-argument ``forward`` (``Pipelined<Class>``), so a
pipeline's state_dict loads into the HF model as is.

Only hidden states cross a stage boundary: each decoder layer makes its
position ids, rotary tables and causal mask from the hidden states' shape.
They depend on nothing else (training batches are windows of text, no
padding), cost ``T * head_dim`` numbers against a layer's ``T * hidden**2``
work, so they are cheaper to recompute than to send; boundaries stay one
tensor, right under any schedule, DualPipe's two copies and recomputation.
Packed documents (``stagewise.data``, ``train --hf --pack``) are the exception: the embedding takes the packed
dict and gives (hidden, position ids, document ids), each decoder layer passes the triple on with the
block-causal 4D mask HF's attention takes (bool for SDPA, additive for eager), and the final norm keeps the
hidden states only.

Under sequence slices (``Schedule.slices``; runtime/stages/kv.py) a slice's positions start at its offset and
each attention takes the earlier slices' keys and values through HF's own cache argument: ``SliceCache.update``
hands them over (as detached leaves whose gradients go back to their slices), and the mask is the causal mask of
the slice's queries over every key so far.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch import nn

from ..data.tensors import block_mask, packed
from ..runtime.stages import kv


def modeling(model_type: str):
    """transformers' modeling module of ``model_type`` (imported on first use)."""
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


class GPT2Embedding(nn.Module):
    """GPT-2's token plus learned position embedding and dropout: ids (B, T) -> hidden (B, T, d)."""

    def __init__(self, config: Any):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.drop = nn.Dropout(config.embd_pdrop)

    def forward(self, input_ids):
        if packed(input_ids):
            x = input_ids
            return self.drop(self.wte(x["input_ids"]) + self.wpe(x["position_ids"])), x["position_ids"], \
                x["document_ids"]
        pos = (torch.arange(input_ids.shape[1], device=input_ids.device) + kv.offset()).unsqueeze(0)
        return self.drop(self.wte(input_ids) + self.wpe(pos))


class PackedEmbedding:
    """Mixed into the token embedding: a packed dict gives (hidden, position ids, document ids)."""

    def forward(self, x):
        if packed(x):
            return super().forward(x["input_ids"]), x["position_ids"], x["document_ids"]
        return super().forward(x)


class PackedNorm:
    """Mixed into the final norm: of a packed run's triple it takes the hidden states only."""

    def forward(self, x):
        return super().forward(x[0] if isinstance(x, tuple) else x)


class PipelinedDecoder:
    """Mixed into transformers' decoder layer class: ``forward(hidden)`` makes positions, rotary and mask.

    ``rotary_emb`` (buffers only, not saved) is attached after the layer is materialized.
    """

    rotary_emb: nn.Module | None
    mask_function: Callable

    def forward(self, hidden):
        documents = None
        extra = {}
        if isinstance(hidden, tuple):  # packed documents: (hidden, position ids, document ids)
            hidden, pos, documents = hidden
            mask = _document_mask(documents, hidden.dtype, self.stagewise_config, self.mask_function)
        else:
            start = kv.offset()
            pos = (torch.arange(hidden.shape[1], device=hidden.device) + start).unsqueeze(0)
            if kv.sliced():
                extra["cache"] = SLICE_CACHE
            if start:  # a later slice: its queries over the earlier slices' keys and its own
                mask = self._slice_mask(hidden, start)
            else:
                mask = self.mask_function(config=self.stagewise_config, inputs_embeds=hidden, attention_mask=None,
                                          cache=None, position_ids=pos)
        if self.rotary_emb is not None:
            extra["position_embeddings"] = self.rotary_emb(hidden, pos)
        out = super().forward(hidden, attention_mask=mask, position_ids=pos, **extra)
        out = out[0] if isinstance(out, tuple) else out
        return out if documents is None else (out, pos, documents)

    def _slice_mask(self, hidden: torch.Tensor, start: int) -> torch.Tensor:
        """The 4-D mask of a slice starting at ``start``: bool for sdpa, additive for eager attention."""
        config = self.stagewise_config
        window = getattr(config, "sliding_window", None) if self.mask_function.__name__.startswith("create_sliding") \
            else None
        T = hidden.shape[1]
        seen = kv.causal_mask(T, start + T, hidden.device, window)[None, None]
        if config._attn_implementation == "sdpa":
            return seen
        return torch.zeros(seen.shape, dtype=hidden.dtype, device=hidden.device).masked_fill(
            ~seen, torch.finfo(hidden.dtype).min)


class SliceCache:
    """What a sliced forward passes as HF's ``cache``: each attention's ``update`` returns its keys and values
    with the earlier slices' prepended (kv.extend: the same detach-and-hand-back rule as every model)."""

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        return kv.extend(keys, values)


SLICE_CACHE = SliceCache()


def _document_mask(documents: torch.Tensor, dtype, config: Any, mask_function: Callable) -> torch.Tensor:
    """The 4D mask of packed rows as HF's attention takes it: causal within each document (and within the
    sliding window where the layer has one); bool for SDPA, additive (0 / dtype's min) for eager."""
    from transformers import masking_utils

    allowed = block_mask(documents)
    if mask_function is masking_utils.create_sliding_window_causal_mask:
        t = documents.shape[-1]
        i = torch.arange(t, device=documents.device)
        allowed = allowed & ((i[:, None] - i[None, :]) < config.sliding_window)
    if getattr(config, "_attn_implementation", "eager") == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=documents.device).masked_fill(~allowed,
                                                                                         torch.finfo(dtype).min)


_CLASSES: dict[tuple[type, type], type] = {}


def pipelined_class(cls: type, mixin: type = PipelinedDecoder) -> type:
    """``Pipelined<cls>``: transformers' class with ``mixin``'s forward (a decoder layer's one-argument one;
    made once per class)."""
    if (cls, mixin) not in _CLASSES:
        _CLASSES[cls, mixin] = type(f"Pipelined{cls.__name__}", (mixin, cls), {"__module__": __name__})
    return _CLASSES[cls, mixin]


def make_layer(config: Any, prefix: str, i: int) -> nn.Module:
    """Layer ``i`` of embedding, ``L`` decoder layers, norm, head, with parameters on the meta device.

    ``prefix``: the modeling module's class prefix ("Llama", "GPT2", ...).
    """
    layers = config.num_hidden_layers
    mod = modeling(config.model_type)
    gpt2 = prefix == "GPT2"
    with torch.device("meta"):
        if i == 0:
            return GPT2Embedding(config) if gpt2 else pipelined_class(nn.Embedding, PackedEmbedding)(
                config.vocab_size, config.hidden_size, config.pad_token_id)
        if i == layers + 1:
            return (pipelined_class(nn.LayerNorm, PackedNorm)(config.hidden_size, eps=config.layer_norm_epsilon)
                    if gpt2 else pipelined_class(getattr(mod, f"{prefix}RMSNorm"), PackedNorm)(
                        config.hidden_size, eps=config.rms_norm_eps))
        if i == layers + 2:
            return nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        cls = pipelined_class(getattr(mod, "GPT2Block" if gpt2 else f"{prefix}DecoderLayer"))
        return cls(config, layer_idx=i - 1)


def finish_decoder(layer: nn.Module, config: Any, prefix: str, k: int, device) -> None:
    """After materializing decoder layer ``k``: its rotary module (computed on ``device``) and mask function."""
    if not isinstance(layer, PipelinedDecoder):
        return
    layer.stagewise_config = config
    layer.mask_function = _mask_function(config, k)
    layer.rotary_emb = None
    if prefix != "GPT2":
        with torch.device(device):
            layer.rotary_emb = getattr(modeling(config.model_type), f"{prefix}RotaryEmbedding")(config=config)


def _mask_function(config: Any, k: int) -> Callable:
    """The mask HF's own model gives decoder layer ``k``: sliding window where its config says so."""
    from transformers import masking_utils

    if config.model_type in ("mistral", "mixtral", "qwen3_moe"):  # no layer_types: a window is every layer's
        sliding = getattr(config, "sliding_window", None) is not None
    else:
        kinds = getattr(config, "layer_types", None)
        sliding = bool(kinds) and kinds[k] == "sliding_attention"
    return masking_utils.create_sliding_window_causal_mask if sliding else masking_utils.create_causal_mask
