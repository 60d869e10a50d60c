"""A Hugging Face causal LM as stagewise's layer sequence ``E, t * L, N, H``, built one layer at a time.

``HFModel.layer(i)`` is the per-rank layer factory: it makes layer ``i`` on
the meta device, materializes only it, and fills it from the folder's
safetensors (only its own tensors are read) or from a seeded initialisation.
Parameter names are HF's own (``names``); a tied embedding and LM head are one
logical parameter declared by name (``ties``): the first stage holds it as the
embedding, the last as the head, and the two copies start from the same tensor.
"""

from __future__ import annotations

import copy

import zlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from .. import limits
from . import configs
from .errors import HFError, within
from .experts import assemble, sources
from .families import MOE, Family, family_of, moe_layer
from .files import inside, read_json

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
    origin: str = ""  #: where the config was read, as messages name it

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
        """Layout letters (the planner's): ``E``, ``t`` per decoder layer (``m`` for one with a sparse MoE block),
        ``N`` (final norm), ``H``."""
        return ["E"] + [self._kind(k + 1) for k in range(self.decoder_layers)] + ["N", "H"]

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

        from .make_layers import finish_decoder, make_layer

        if not 0 <= i < self.num_layers:
            raise HFError(f"layer {i} is out of range; the model has layers 0..{self.num_layers - 1}")
        if "_checked" not in self.__dict__:  # made without load: nothing is allocated before the model is checked
            self.check()
        prefix = family_of(self.config.model_type)[1]
        module = make_layer(self.config, prefix, i).to_empty(device=device).to(getattr(torch, self.dtype))
        _keep_fp32(module, self.config, prefix)
        names = self.names(i, module)
        kept = _kept_buffers(module)  # persistent buffers (DeepSeek-V3's e_score_correction_bias): stored, or 0
        wanted = {hf: tuple(module.get_parameter(local).shape) for local, hf in names.items()}  # without weights
        buffers = {f"{self.prefixes[i]}.{b}": tuple(module.get_buffer(b).shape) for b in kept}
        values = self._values({**wanted, **buffers})
        with torch.no_grad():
            for local, hf in names.items():
                param = module.get_parameter(local)
                value = values.get(self.source(hf))
                if value is None:
                    _init(param, module, local, self._generator(hf), self.config)
                else:
                    param.copy_(value)
            for local in kept:
                value = values.get(f"{self.prefixes[i]}.{local}")
                buf = module.get_buffer(local)
                buf.copy_(value) if value is not None else buf.zero_()
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
                      names=self.prefixes, ties=self.ties, tp_plan=self.tp_plan, tp_divides=self.tp_divides)

    @property
    def tp_plan(self) -> dict | None:
        """transformers' own tensor-parallel plan of the base model (``base_model_tp_plan``: patterns such as
        ``layers.*.self_attn.q_proj``, matched against the ends of our HF names); None: it has none."""
        plan = getattr(self.config, "base_model_tp_plan", None)
        return dict(plan) if plan else None

    @property
    def tp_divides(self) -> tuple[tuple[str, int], ...]:
        """What tensor parallel splits among the tp ranks, which `tp` must divide: the heads."""
        c = self.config
        heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
        kv = getattr(c, "num_key_value_heads", None)
        return tuple((what, int(n)) for what, n in (("attention heads", heads), ("key/value heads", kv)) if n)

    def check(self) -> None:
        """Everything about the model that holds before a rank builds a layer; ``HFError`` naming what does not.

        The config's fields and sizes (``configs.check``: types, ranges, heads, ``LAYERS``, ``ELEMENTS``),
        that transformers builds each kind of layer from it (on the meta device: no memory), the parameter
        count against ``PARAMETERS``, and with a folder every tensor of every layer: present, of the shape
        the config makes, of a floating dtype (from the files' headers; no tensor is read). ``load`` calls
        it; a launcher may call it again before it starts ranks.

        >>> load("tiny-llama").check()      # doctest: +SKIP
        """
        d = configs.check(self.config.to_dict(), self.where)
        ck = self.checkpoint() if self.folder is not None else None  # a folder without weights says so first
        n = self.parameter_count
        within(limits.PARAMETERS, n, f"{self.where}: {n} parameters (num_hidden_layers {d.layers}, hidden_size "
               f"{d.hidden}, MLP {d.inner}, vocab_size {d.vocab})")
        for i in range(self.num_layers if ck else 0):
            for local, shape in self._shapes[self._kind(i)].items():
                hf = f"{self.prefixes[i]}.{local}"
                for piece in sources(self.config.model_type, self.source(hf), shape, ck.tensors):
                    ck.check(ck.resolve(piece.name, self.family.base), piece.shape, hf)
            for local, shape in self._buffer_shapes[self._kind(i)].items():  # a router's bias is learned state too
                hf = f"{self.prefixes[i]}.{local}"
                ck.check(ck.resolve(hf, self.family.base), shape, hf)
        self.__dict__["_checked"] = True  # frozen dataclass: a cache, as cached_property keeps one

    @cached_property
    def parameter_count(self) -> int:
        """The model's parameters (a tied head counted once, as HF counts them), from the config alone."""
        per = {k: sum(_numel(s) for s in shapes.values()) for k, shapes in self._shapes.items()}
        head = 0 if self.tied else per["H"]
        return per["E"] + sum(per[self._kind(k + 1)] for k in range(self.decoder_layers)) + per["N"] + head

    @cached_property
    def _shapes(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Each kind of layer's parameters (local name -> shape), built on the meta device: every decoder
        layer of one kind (dense ``t``, sparse MoE ``m``) has the same ones."""
        return {kind: params for kind, (params, _) in self._layouts.items()}

    @cached_property
    def _buffer_shapes(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Each kind of layer's persistent buffers (DeepSeek-V3's ``e_score_correction_bias``): a folder with
        weights must store them, as transformers' ``save_pretrained`` does."""
        return {kind: buffers for kind, (_, buffers) in self._layouts.items()}

    @cached_property
    def _layouts(self) -> dict[str, tuple[dict, dict]]:
        """(parameters, persistent buffers) of each kind of layer, local name -> shape, from the meta device."""
        from .make_layers import finish_decoder, make_layer

        prefix = family_of(self.config.model_type)[1]
        out = {}
        first = {}
        for i in range(1, self.decoder_layers + 1):
            first.setdefault(self._kind(i), i)
        for kind, i in (("E", 0), *first.items(), ("N", self.decoder_layers + 1), ("H", self.decoder_layers + 2)):
            try:
                module = make_layer(self.config, prefix, i)
                finish_decoder(module, self.config, prefix, i - 1, "meta")
            except Exception as e:  # noqa: BLE001 - transformers' own refusal of a config, said in our words
                raise configs.refusal(self.config.to_dict(), self.where, f"layer {i} ({self.prefixes[i]})",
                                      e) from None
            out[kind] = ({local: tuple(p.shape) for local, p in module.named_parameters(remove_duplicate=False)},
                         {local: tuple(module.get_buffer(local).shape) for local in _kept_buffers(module)})
        return out

    def _kind(self, i: int) -> str:
        if i == 0:
            return "E"
        if i <= self.decoder_layers:
            return "m" if moe_layer(self.config.model_type, i - 1, lambda f: getattr(self.config, f, None)) else "t"
        return "N" if i == self.decoder_layers + 1 else "H"

    @property
    def where(self) -> str:
        return self.origin or self.folder or f"the {self.config.model_type} config"

    def check_fit(self, stages: int, split=None) -> None:
        """The schedule's ``stages`` per model copy must each get a layer: say so in the model's own terms."""
        if split is None and stages > self.num_layers:
            raise HFError(f"the model has {self.decoder_layers} decoder layers ({self.num_layers} layers with the "
                          f"embedding, final norm and LM head) but the schedule needs {stages} stages per model copy; "
                          "each stage needs at least one layer: use fewer `ranks` or `chunks`, or a model with more "
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

    def shifted_loss(self, logits, shift_labels):
        """The same loss from labels already shifted (``shift_labels``: position t holds token t + 1, -100 at each
        sequence's end), as transformers takes them for context parallel: a sequence slice's labels then hold the
        next slice's first token, which a shift inside the slice would lose."""
        from transformers.loss.loss_utils import ForCausalLMLoss

        return ForCausalLMLoss(logits, None, vocab_size=self.config.vocab_size,
                               shift_labels=shift_labels.contiguous())

    @staticmethod
    def shift_labels(labels):
        """``labels`` (B, T) shifted left by one, -100 (ignored) at each sequence's end: ``shifted_loss``'s labels."""
        import torch.nn.functional as F

        return F.pad(labels[:, 1:], (0, 1), value=-100)

    def checkpoint(self):
        """This process's reader of ``folder`` (one per folder, so its read counts add up)."""
        return _checkpoint(self.folder)

    def _values(self, wanted: dict) -> dict:
        """The stored values of these HF names (name -> shape; ``check`` has checked each one's pieces), keyed by
        ``source``; a stacked expert tensor is built from its per-expert pieces (experts.py)."""
        if self.folder is None:
            return {}
        ck, base = self.checkpoint(), self.family.base
        plan = {}
        for h, shape in wanted.items():
            src = self.source(h)
            plan[src] = [ck.resolve(p.name, base) for p in sources(self.config.model_type, src, shape, ck.tensors)]
        got = ck.read(sorted({n for names in plan.values() for n in names}))
        return {src: assemble([got[n] for n in names], src) for src, names in plan.items()}

    def _generator(self, hf: str):
        import torch

        return torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(self.source(hf).encode()))


_CHECKPOINTS: dict = {}


def _checkpoint(folder: str):
    from .weights import Checkpoint

    if folder not in _CHECKPOINTS:
        _CHECKPOINTS[folder] = Checkpoint(folder)
    return _CHECKPOINTS[folder]


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _kept_buffers(module) -> list[str]:
    """Local names of a layer's persistent buffers (saved in a state_dict; rotary tables are not)."""
    out = []
    for path, sub in module.named_modules():
        for name, buf in sub._buffers.items():
            if buf is not None and name not in sub._non_persistent_buffers_set:
                out.append(f"{path}.{name}" if path else name)
    return out


def _keep_fp32(module, config, prefix: str) -> None:
    """What transformers keeps in float32 whatever the dtype (its ``_keep_in_fp32_modules_strict``: DeepSeek-V3's
    router), kept so here too."""
    import torch

    from .make_layers import modeling

    keep = getattr(getattr(modeling(config.model_type), f"{prefix}PreTrainedModel", None),
                   "_keep_in_fp32_modules_strict", None) or ()
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if any(name == k or name.endswith("." + k) or f".{k}." in f".{name}" for k in keep):
            t.data = t.data.float()


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


def load(source: str | Path, *, dtype: str = "float32", seed: int = 0, attention: str = "sdpa") -> HFModel:
    """An ``HFModel`` from a folder (config.json + safetensors) or a config.json alone (random weights).

    ``attention``: transformers' attention implementation ("sdpa" as HF's default on torch, or "eager").
    Everything ``HFModel.check`` checks is checked here, before any tensor is made: an unsupported
    architecture, a config field of the wrong type or value, a model over the limits, weight files that
    are missing, outside the folder, not regular files or not valid safetensors, a tensor of the wrong
    shape or dtype; each is an ``HFError`` naming the file, the field or the tensor.

    >>> model = load("tiny-llama")                # doctest: +SKIP
    >>> model.num_layers, model.parameter_count   # doctest: +SKIP
    (6, 165184)
    """
    if dtype not in DTYPES:
        raise HFError(f"`dtype` {dtype!r}: must be one of {', '.join(DTYPES)}")
    if attention not in ATTENTION:
        raise HFError(f"`attention` {attention!r}: must be one of {', '.join(ATTENTION)}")
    path = Path(source)
    folder = path.is_dir()
    if folder and not (path / "config.json").is_symlink() and not (path / "config.json").exists():
        raise HFError(f"`source` {path}: no config.json; give a model folder (config.json + safetensors) or a "
                      "config.json")
    file = inside(path, "config.json", f"`source` {path}") if folder else path
    shown = str(file) if folder else f"`source` {path}"
    config = _config(read_json(file, "" if folder else "`source`"), shown)
    config._attn_implementation = attention  # what from_pretrained would set; layers read it at run time
    if config.model_type in MOE:  # experts run one by one (from_pretrained may pick grouped_mm where it dispatches)
        config._experts_implementation = "eager"
    model = HFModel(config=config, folder=str(path) if folder else None, dtype=dtype, seed=seed, origin=shown)
    model.check()
    return model


def _config(raw, where: str):
    """The transformers config of a parsed config.json, once every rule of ``configs.check`` holds."""
    configs.check(raw, where)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[raw["model_type"]]
    try:
        return cls.from_dict(copy.deepcopy(raw))  # transformers rewrites rope fields in place
    except Exception as e:  # noqa: BLE001 - transformers' own validation, said in our words
        raise configs.refusal(raw, where, cls.__name__, e, lambda r: cls.from_dict(copy.deepcopy(r))) from None
