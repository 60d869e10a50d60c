"""A Hugging Face causal LM as stagewise's layer sequence ``E, t * L, N, H``, built one layer at a time.

``HFModel.layer(i)`` is the per-rank layer factory: it makes layer ``i`` on
the meta device, materializes only it, and fills it from the folder's
safetensors (only its own tensors are read) or from a seeded initialisation.
Parameter names are HF's own (``names``); a tied embedding and LM head are one
logical parameter declared by name (``ties``): the first stage holds it as the
embedding, the last as the head, and the two copies start from the same tensor.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .errors import HFError
from .families import Family, family_of

DTYPES = ("float32", "bfloat16", "float16", "float64")
ATTENTION = ("sdpa", "eager")


@dataclass(frozen=True, kw_only=True)
class HFModel:
    """A covered causal LM (config + optional weights folder) as a layer factory.

    >>> m = load("path/to/Llama-3.2-1B")            # doctest: +SKIP
    >>> emb = m.layer(0)                            # only the embedding's tensors are read
    >>> m.num_layers, m.names(0, emb)               # doctest: +SKIP
    (19, {'weight': 'model.embed_tokens.weight'})
    """

    config: Any  #: the transformers config (PretrainedConfig)
    folder: str | None = None  #: safetensors weights; None = seeded random initialisation
    dtype: str = "float32"  #: parameter dtype
    seed: int = 0  #: random initialisation (when there is no folder)

    @property
    def family(self) -> Family:
        return family_of(self.config.model_type)[0]

    @property
    def decoder_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def num_layers(self) -> int:
        """Embedding, decoder layers, final norm, LM head."""
        return self.decoder_layers + 3

    @property
    def symbols(self) -> list[str]:
        """Layout letters (the planner's): ``E``, ``t`` per decoder layer, ``N`` (final norm), ``H``."""
        return ["E"] + ["t"] * self.decoder_layers + ["N", "H"]

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Each layer's prefix in HF's state_dict: ``model.embed_tokens``, ``model.layers.0``, ..., ``lm_head``."""
        return tuple(self.family.prefix(i, self.decoder_layers) for i in range(self.num_layers))

    @property
    def tied(self) -> bool:
        """The LM head's weight is the token embedding's."""
        return bool(getattr(self.config, "tie_word_embeddings", False))

    @property
    def ties(self) -> tuple[tuple[str, str], ...]:
        """HF names of parameters that are one logical parameter: (embedding weight, LM head weight)."""
        return ((self.family.token_weight, f"{self.family.head}.weight"),) if self.tied else ()

    def layer(self, i: int, device="cpu"):
        """Layer ``i`` only: made on the meta device, materialized on ``device``, filled from the folder
        (only its own tensors are read) or from the seeded initialisation."""
        import torch

        from .layers import finish_decoder, make_layer

        if not 0 <= i < self.num_layers:
            raise HFError(f"layer {i} is out of range; the model has layers 0..{self.num_layers - 1}")
        prefix = family_of(self.config.model_type)[1]
        module = make_layer(self.config, prefix, i).to_empty(device=device).to(getattr(torch, self.dtype))
        names = self.names(i, module)
        values = self._values(names.values())
        with torch.no_grad():
            for local, hf in names.items():
                param = module.get_parameter(local)
                value = values.get(self.source(hf))
                if value is None:
                    _init(param, module, local, self._generator(hf), self.config)
                else:
                    _copy(param, value, hf)
        finish_decoder(module, self.config, prefix, i - 1, device)
        return module

    def layers(self, device="cpu") -> list:
        """Every layer, in one process (the unpipelined model); a tied head shares the embedding's Parameter."""
        out = [self.layer(i, device) for i in range(self.num_layers)]
        if self.tied:
            out[-1].weight = out[0].get_parameter(self.family.token_weight.removeprefix(self.prefixes[0] + "."))
        return out

    def as_layers(self, device=None):
        """The model as ``stagewise.Layers``: each rank builds only its own layers (from its own tensors);
        names are HF's module paths and the tied embedding and head are declared by name."""
        from functools import partial

        from ..runtime.stages.layers import Layers

        return Layers(count=self.num_layers, build=partial(self.layer, device=device or "cpu"),
                      names=self.prefixes, ties=self.ties)

    def check_fit(self, stages: int, split=None) -> None:
        """The schedule's ``stages`` per model copy must each get a layer: say so in the model's own terms."""
        if split is None and stages > self.num_layers:
            raise HFError(f"the model has {self.decoder_layers} decoder layers ({self.num_layers} layers with the "
                          f"embedding, final norm and LM head) but the schedule needs {stages} stages per model copy; "
                          "each stage needs at least one layer: use fewer ranks or chunks, or a model with more "
                          "layers")

    def names(self, i: int, module) -> dict[str, str]:
        """Layer ``i``'s parameters: local name -> HF name (its prefix, then the local name)."""
        return {local: f"{self.prefixes[i]}.{local}" for local, _ in module.named_parameters(remove_duplicate=False)}

    def source(self, hf: str) -> str:
        """The HF name a parameter's value is stored under (a tied head's is the embedding's)."""
        return self.family.token_weight if self.tied and hf == f"{self.family.head}.weight" else hf

    def hf_state_dict(self, layers: Mapping[int, Any]) -> dict:
        """HF-named tensors of the given layers (index -> module), each stored name once (no tied head)."""
        out = {}
        for i, module in layers.items():
            for local, hf in self.names(i, module).items():
                if self.source(hf) == hf:
                    out[hf] = module.get_parameter(local).detach()
        return out

    def save_shard(self, folder: str | Path, layers: Mapping[int, Any], k: int, n: int) -> Path:
        """Write shard ``k`` of ``n``: these layers' tensors under HF names (call ``write_index`` after all)."""
        from .weights import save_shard

        return save_shard(folder, k, n, self.hf_state_dict(layers))

    def write_index(self, folder: str | Path, n: int) -> Path:
        """Once every shard is written: the index and config.json, so ``from_pretrained(folder)`` loads it."""
        from .weights import write_index

        return write_index(folder, n, self.config)

    def loss(self, logits, labels):
        """transformers' own causal LM loss: labels shifted inside, mean over tokens (``model(ids, labels=ids)``)."""
        from transformers.loss.loss_utils import ForCausalLMLoss

        return ForCausalLMLoss(logits, labels, vocab_size=self.config.vocab_size)

    def checkpoint(self):
        """This process's reader of ``folder`` (one per folder, so its read counts add up)."""
        return _checkpoint(self.folder)

    def _values(self, hf_names) -> dict:
        if self.folder is None:
            return {}
        ck = self.checkpoint()
        stored = {self.source(h): ck.resolve(self.source(h), self.family.base) for h in hf_names}
        got = ck.read(sorted(set(stored.values())))
        return {h: got[s] for h, s in stored.items()}

    def _generator(self, hf: str):
        import torch

        return torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(self.source(hf).encode()))


_CHECKPOINTS: dict = {}


def _checkpoint(folder: str):
    from .weights import Checkpoint

    if folder not in _CHECKPOINTS:
        _CHECKPOINTS[folder] = Checkpoint(folder)
    return _CHECKPOINTS[folder]


def _copy(param, value, hf: str) -> None:
    if tuple(value.shape) != tuple(param.shape):
        raise HFError(f"tensor {hf} has shape {tuple(value.shape)} in the checkpoint; the config makes "
                      f"{tuple(param.shape)}")
    param.copy_(value)


def _init(param, module, local: str, gen, config) -> None:
    """HF's initialisation: norms 1 (bias 0), biases 0, other weights N(0, initializer_range)."""
    import torch

    owner = module.get_submodule(local.rpartition(".")[0])
    if local.endswith("bias"):
        param.zero_()
    elif "Norm" in type(owner).__name__:
        param.fill_(1.0)
    else:
        std = float(getattr(config, "initializer_range", 0.02))
        param.copy_(torch.normal(0.0, std, tuple(param.shape), generator=gen))
        pad = getattr(owner, "padding_idx", None)
        if pad is not None:
            param[pad].zero_()


def load(path: str | Path, *, dtype: str = "float32", seed: int = 0, attention: str = "sdpa") -> HFModel:
    """An ``HFModel`` from a folder (config.json + safetensors) or a config.json alone (random weights).

    ``attention``: transformers' attention implementation ("sdpa" as HF's default on torch, or "eager").
    Raises ``HFError`` for an unsupported architecture or a folder without weights.
    """
    path = Path(path)
    if dtype not in DTYPES:
        raise HFError(f"--dtype must be one of {', '.join(DTYPES)}; got {dtype}")
    if attention not in ATTENTION:
        raise HFError(f"attention must be one of {', '.join(ATTENTION)}; got {attention}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise HFError(f"--hf {path}: no config.json; give a model folder (config.json + safetensors) or a config.json")
    config = _config(path / "config.json" if path.is_dir() else path)
    config._attn_implementation = attention  # what from_pretrained would set; layers read it at run time
    if path.is_dir():
        _checkpoint(str(path))  # a folder must hold weights: fail here, not on a rank
        return HFModel(config=config, folder=str(path), dtype=dtype, seed=seed)
    return HFModel(config=config, folder=None, dtype=dtype, seed=seed)


def _config(path: Path):
    """The transformers config of a config.json, after checking that its model_type is covered."""
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise HFError(f"--hf {path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise HFError(f"--hf {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(raw, dict) or not raw.get("model_type"):
        raise HFError(f"--hf {path}: no model_type; a transformers config.json names its model_type")
    family_of(raw["model_type"], raw.get("architectures"))
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))
