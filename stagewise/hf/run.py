"""An HF model and its training text as one picklable run model: what ``stagewise train --hf`` runs.

It travels to every rank; each rank loads the config and builds layers from
the folder itself (``load`` is cached per process).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .data import TextData
from .model import HFModel, load


@dataclass(frozen=True, kw_only=True)
class HFRun:
    """A causal LM (folder or config.json) trained on a text file.

    >>> run = HFRun(source="models/tiny-llama", data=TextData(path="train.txt", seq=64))   # doctest: +SKIP
    >>> ids, labels = run.batch(step=0, size=8)
    """

    source: str  #: a model folder (config.json + safetensors) or a config.json (random weights)
    data: TextData
    dtype: str = "float32"
    seed: int = 0  #: the random initialisation without weights
    attention: str = "sdpa"

    @cached_property
    def model(self) -> HFModel:
        return load(self.source, dtype=self.dtype, seed=self.seed, attention=self.attention)

    def __getstate__(self):  # the loaded model is rebuilt on each rank, not pickled
        return {k: v for k, v in self.__dict__.items() if k != "model"}

    def __setstate__(self, state):
        self.__dict__.update(state)

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def name(self) -> str:
        return f"{self.model.config.model_type} ({self.source})"

    def check(self) -> None:
        """The model is covered and has weights (or is a config), and the text fits it; raises ``HFError``."""
        self.data.check(self.model.config)

    def layers(self) -> list:
        return self.model.layers()

    def batch(self, step: int, size: int):
        return self.data.batch(step, size)

    def loss(self, logits, labels):
        return self.model.loss(logits, labels)
