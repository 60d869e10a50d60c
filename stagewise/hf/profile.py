"""An HF causal LM as a ``ModelConfig`` (the runtime's model interface): what ``stagewise profile --hf`` measures.

The layers are the adapter's ``E, t * L, N, H`` (HF names as layer names), the
batches random token ids of ``seq`` tokens, the loss transformers' own. Equal
decoder layers are timed once (the profiler's rule), so the embedding, norm
and head come out lighter than a decoder layer, as in Llama 3's stages.
"""

from __future__ import annotations

from .model import HFModel


def profile_model(model: HFModel, seq: int, source: str):
    """The ``runtime.models.LayerModel`` of ``model`` (loaded from ``source``) at sequence length ``seq``."""
    import torch

    from ..runtime.run.models import LayerModel

    vocab = int(model.config.vocab_size)

    def make_batch(step: int, size: int):
        ids = torch.randint(0, vocab, (size, seq), generator=torch.Generator().manual_seed(size))
        return ids, ids

    return LayerModel(name=f"{model.config.model_type} ({model.decoder_layers} layers)",
                      layer_list=tuple(model.layers()), make_batch=make_batch, loss_fn=model.loss,
                      symbols=model.symbols, names=list(model.prefixes),
                      meta={"hf": {"source": source, "seq": seq, "dtype": model.dtype}})
