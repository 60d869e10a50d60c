"""Hugging Face causal LMs (the Llama family, GPT-2, and the mixtures of experts Mixtral, Qwen2-MoE,
Qwen3-MoE, DeepSeek-V3) as the runtime's one model interface, a per-rank ``Layers`` factory whose layers are
transformers' own modules under HF's names; ``pip install stagewise[hf]``. transformers is imported only when
a model is loaded or built; each rank reads only its own layers' tensors. ``run.HFRun`` is the adapter as a
run's model (``stagewise train --hf``).

May import: the core, `stagewise.runtime`, `stagewise.data` (packed documents), `torch`, `transformers`, `safetensors`.
"""

from .errors import HFError
from .model import HFModel, load

__all__ = ["HFError", "HFModel", "load"]
