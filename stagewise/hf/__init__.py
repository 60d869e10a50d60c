"""Hugging Face causal LMs (Llama family, GPT-2) as stagewise layer sequences; ``pip install stagewise[hf]``.

transformers is imported only when a model is loaded or built.
"""

from .errors import HFError
from .model import HFModel, load

__all__ = ["HFError", "HFModel", "load"]
