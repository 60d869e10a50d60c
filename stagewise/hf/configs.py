"""An HF ``config.json`` checked field by field before transformers builds it or any tensor is made.

A few bytes of config can ask for any model: ``{"model_type": "llama"}`` is
transformers' default Llama, 6.7B parameters. ``check`` reads each field the
adapter's layers use, as the file gives it or as transformers' default fills
it in, and refuses a wrong type or range, heads that do not fit together, and
sizes over stagewise.limits' ``LAYERS`` and ``ELEMENTS`` (the largest tensor),
naming the file, the field, its value and the rule. The parameter count, which
needs the layers, is ``HFModel.check``'s. Only transformers' configuration
classes are imported here (their defaults), not its models.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from .. import limits
from .errors import HFError, within
from .families import family_of
from .files import shown

#: whole-number fields: (field, smallest value, may be null); each family reads its own
_LLAMA_SIZES = (("vocab_size", 1, False), ("hidden_size", 1, False), ("intermediate_size", 1, False),
                ("num_hidden_layers", 1, False), ("num_attention_heads", 1, False),
                ("num_key_value_heads", 1, True), ("head_dim", 1, True), ("sliding_window", 1, True))
_GPT2_SIZES = (("vocab_size", 1, False), ("hidden_size", 1, False), ("n_inner", 1, True),
               ("num_hidden_layers", 1, False), ("num_attention_heads", 1, False),
               ("max_position_embeddings", 1, False))
#: float fields: (field, smallest, largest, whether the smallest itself is allowed)
_LLAMA_FLOATS = (("rms_norm_eps", 0.0, math.inf, False), ("initializer_range", 0.0, 1.0, True),
                 ("attention_dropout", 0.0, 1.0, True))
_GPT2_FLOATS = (("layer_norm_epsilon", 0.0, math.inf, False), ("initializer_range", 0.0, 1.0, True),
                ("embd_pdrop", 0.0, 1.0, True), ("resid_pdrop", 0.0, 1.0, True), ("attn_pdrop", 0.0, 1.0, True))
_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "norm_topk_prob", "output_router_logits")
#: the mixtures of experts' own fields: the experts' count field, then (field, smallest, may be null)
_MOE = {
    "mixtral": ("num_local_experts", (("num_local_experts", 1, False), ("num_experts_per_tok", 1, False))),
    "qwen2_moe": ("num_experts", (("num_experts", 1, False), ("num_experts_per_tok", 1, False),
                                  ("moe_intermediate_size", 1, False), ("shared_expert_intermediate_size", 1, False),
                                  ("decoder_sparse_step", 1, False))),
    "qwen3_moe": ("num_experts", (("num_experts", 1, False), ("num_experts_per_tok", 1, False),
                                  ("moe_intermediate_size", 1, False), ("decoder_sparse_step", 1, False))),
    "deepseek_v3": ("num_local_experts", (("num_local_experts", 1, False), ("num_experts_per_tok", 1, False),
                                          ("moe_intermediate_size", 1, False), ("n_shared_experts", 1, False),
                                          ("first_k_dense_replace", 0, False), ("n_group", 1, False),
                                          ("topk_group", 1, False), ("q_lora_rank", 1, True),
                                          ("kv_lora_rank", 1, False), ("qk_rope_head_dim", 2, False),
                                          ("qk_nope_head_dim", 1, False), ("v_head_dim", 1, False))),
}
#: the mixtures of experts' float fields, where a family has them: (field, smallest, largest, smallest allowed)
_MOE_FLOATS = (("routed_scaling_factor", 0.0, math.inf, False), ("router_aux_loss_coef", 0.0, math.inf, True),
               ("router_jitter_noise", 0.0, 1.0, True))
#: the attention kinds a decoder layer's mask is made for (layers.py)
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True, kw_only=True)
class Dims:
    """The sizes a config makes, transformers' defaults filled in (GPT-2's names mapped to Llama's)."""

    vocab: int
    hidden: int
    layers: int  #: decoder layers
    heads: int
    kv_heads: int
    head_dim: int
    inner: int  #: the MLP's hidden size
    positions: int  #: learned positions (GPT-2), 0 for rotary models
    experts: int = 0  #: routed experts of a sparse MoE block (0: dense)
    expert_inner: int = 0  #: an expert's hidden size

    def tensors(self) -> tuple[tuple[str, int], ...]:
        """The largest tensors, each as (what, elements), in the config's words."""
        out = [("vocab_size x hidden_size (the token embedding, the LM head)", self.vocab * self.hidden),
               ("hidden_size x the MLP size (one MLP weight)", self.hidden * self.inner),
               ("num_attention_heads x head_dim x hidden_size (the query projection)",
                self.heads * self.head_dim * self.hidden)]
        if self.positions:
            out += [("n_positions x hidden_size (the position embedding)", self.positions * self.hidden),
                    ("3 x hidden_size^2 (the attention's c_attn)", 3 * self.hidden * self.hidden)]
        if self.experts:
            out.append(("experts x 2 x their intermediate size x hidden_size (the stacked experts' gate_up_proj)",
                        self.experts * 2 * self.expert_inner * self.hidden))
        return tuple(out)


def check(raw: Any, where: str) -> Dims:
    """The sizes of the config ``raw`` (parsed JSON from ``where``), after every rule holds; ``HFError`` otherwise."""
    if not isinstance(raw, dict):
        raise HFError(f"{where}: not a JSON object; a transformers config.json is an object with a model_type")
    model_type = raw.get("model_type")
    if model_type is None or model_type == "":
        raise HFError(f"{where}: no model_type; a transformers config.json names its model_type")
    if not isinstance(model_type, str):
        raise HFError(f"{where}: model_type is {shown(model_type)}; it must be a string such as \"llama\"")
    architectures = raw.get("architectures")
    try:
        family_of(model_type, architectures if _strings(architectures) else None)
    except HFError as e:
        raise HFError(f"{where}: {e}") from None
    values = _Values(raw, model_type, where)
    gpt2 = model_type == "gpt2"
    for name, low, null in _GPT2_SIZES if gpt2 else _LLAMA_SIZES:
        if name == "sliding_window" and model_type == "qwen2_moe" and values.get(name) == 0:
            continue  # transformers writes 0 when use_sliding_window is off
        values.whole(name, low, null)
    for name, low, high, closed in _GPT2_FLOATS if gpt2 else _LLAMA_FLOATS:
        values.number(name, low, high, closed)
    for name in _BOOLS:
        values.flag(name)
    values.activation("activation_function" if gpt2 else "hidden_act")
    dims = _gpt2_dims(values) if gpt2 else _llama_dims(values)
    if not gpt2:
        _check_llama(values, dims)
        _check_rope(values)
    _check_dtype(values)
    if model_type in _MOE:
        dims = _check_moe(values, dims, model_type)
    _check_sizes(dims, where)
    return dims


class _Values:
    """A config's fields: the file's value, else transformers' default for that model_type."""

    def __init__(self, raw: dict, model_type: str, where: str):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        cls = CONFIG_MAPPING[model_type]
        self.raw, self.where = raw, where
        self.aliases = dict(getattr(cls, "attribute_map", {}))  # GPT-2: hidden_size -> n_embd, ...
        self.defaults = {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    def key(self, name: str) -> str:
        """The field as the file spells it (GPT-2 writes n_embd for hidden_size)."""
        stored = self.aliases.get(name, name)
        return stored if stored in self.raw or name not in self.raw else name

    def given(self, name: str) -> bool:
        return self.key(name) in self.raw

    def get(self, name: str) -> Any:
        key = self.key(name)
        return self.raw[key] if key in self.raw else self.defaults.get(self.aliases.get(name, name))

    def fail(self, name: str, rule: str) -> HFError:
        return HFError(f"{self.where}: {self.key(name)} is {shown(self.get(name))}; {rule}")

    def whole(self, name: str, low: int, null: bool) -> None:
        v = self.get(name)
        if v is None and null:
            return
        if not _is_int(v) or v < low:
            raise self.fail(name, f"it must be a whole number >= {low}" + (" or null" if null else ""))

    def number(self, name: str, low: float, high: float, closed: bool) -> None:
        v = self.get(name)
        if v is None and not self.given(name):
            return
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or not (low <= v <= high) or (v == low and not closed):
            span = f"{'>=' if closed else '>'} {low:g}" + (f" and <= {high:g}" if math.isfinite(high) else "")
            raise self.fail(name, f"it must be a finite number {span}")

    def flag(self, name: str) -> None:
        if self.given(name) and not isinstance(self.get(name), bool):
            raise self.fail(name, "it must be true or false")

    def activation(self, name: str) -> None:
        from transformers.activations import ACT2FN

        v = self.get(name)
        if not isinstance(v, str) or v not in ACT2FN:
            raise self.fail(name, f"transformers knows the activations {', '.join(sorted(ACT2FN))}")


def _llama_dims(v: _Values) -> Dims:
    hidden, heads = v.get("hidden_size"), v.get("num_attention_heads")
    return Dims(vocab=v.get("vocab_size"), hidden=hidden, layers=v.get("num_hidden_layers"), heads=heads,
                kv_heads=v.get("num_key_value_heads") or heads, head_dim=v.get("head_dim") or hidden // heads,
                inner=v.get("intermediate_size"), positions=0)


def _gpt2_dims(v: _Values) -> Dims:
    hidden, heads = v.get("hidden_size"), v.get("num_attention_heads")
    if hidden % heads:
        raise v.fail("hidden_size", f"it must be a multiple of {v.key('num_attention_heads')} ({heads})")
    return Dims(vocab=v.get("vocab_size"), hidden=hidden, layers=v.get("num_hidden_layers"), heads=heads,
                kv_heads=heads, head_dim=hidden // heads, inner=v.get("n_inner") or 4 * hidden,
                positions=v.get("max_position_embeddings"))


def _check_llama(v: _Values, d: Dims) -> None:
    """Heads that fit together (grouped-query attention, rotary halves), layer kinds, the padding token."""
    if not v.get("head_dim") and d.hidden % d.heads:
        raise v.fail("hidden_size", f"it must be a multiple of num_attention_heads ({d.heads}) when the config "
                     "gives no head_dim")
    if d.heads % d.kv_heads:
        raise v.fail("num_key_value_heads", f"it must divide num_attention_heads ({d.heads}): each kv head serves "
                     "a group of query heads")
    if d.head_dim % 2:
        raise HFError(f"{v.where}: head_dim is {d.head_dim}; rotary positions rotate pairs, so it must be even")
    kinds = v.raw.get("layer_types")
    if kinds is not None and not (isinstance(kinds, list) and len(kinds) == d.layers and all(
            isinstance(k, str) and k in LAYER_TYPES for k in kinds)):
        raise v.fail("layer_types", f"it must list one of {', '.join(LAYER_TYPES)} per layer "
                     f"(num_hidden_layers = {d.layers})")
    pad = v.get("pad_token_id")
    if pad is not None and not (_is_int(pad) and -d.vocab <= pad < d.vocab):
        raise v.fail("pad_token_id", f"it must be null or a token id of the vocabulary (vocab_size {d.vocab})")


def _check_rope(v: _Values) -> None:
    """Rotary positions: ``rope_theta`` a finite number > 0; ``rope_scaling`` (or ``rope_parameters``) null or an
    object whose type transformers has and whose ``factor`` is a finite number >= 1 (transformers only warns of
    a smaller one, and an unknown type fails deep inside its rotary embedding)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if "rope_theta" in v.raw and not _finite(v.raw["rope_theta"], above=0.0):
        raise v.fail("rope_theta", "it must be a finite number > 0 (the rotary base)")
    for name in ("rope_scaling", "rope_parameters"):
        rope = v.raw.get(name)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise v.fail(name, "it must be null or an object such as {\"rope_type\": \"linear\", \"factor\": 2.0}")
        kind = rope.get("rope_type", rope.get("type", "default"))
        kinds = ("default", *ROPE_INIT_FUNCTIONS)
        if kind not in kinds:
            raise HFError(f"{v.where}: {name}.rope_type is {shown(kind)}; transformers has the rotary types "
                          f"{', '.join(kinds)}")
        if "factor" in rope and not (_finite(rope["factor"]) and rope["factor"] >= 1):
            raise HFError(f"{v.where}: {name}.factor is {shown(rope['factor'])}; it must be a finite number >= 1 "
                          "(the context's stretch)")
        if "rope_theta" in rope and not _finite(rope["rope_theta"], above=0.0):
            raise HFError(f"{v.where}: {name}.rope_theta is {shown(rope['rope_theta'])}; it must be a finite number "
                          "> 0 (the rotary base)")


def _check_dtype(v: _Values) -> None:
    """``torch_dtype`` (or ``dtype``): null, "auto" or a floating torch dtype's name."""
    import torch

    for name in ("torch_dtype", "dtype"):
        x = v.raw.get(name)
        if x is None or x == "auto":
            continue
        dtype = getattr(torch, x, None) if isinstance(x, str) else None
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise v.fail(name, "it must be null, \"auto\" or a floating torch dtype such as \"bfloat16\"")


def _finite(x: Any, *, above: float = -math.inf) -> bool:
    """A finite number (not a bool), greater than ``above``."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > above


def refusal(raw: dict, where: str, who: str, e: BaseException, rebuild=None) -> HFError:
    """transformers' refusal of the config ``raw`` (``who``: its config class, or the layer it was building) in
    our words: the field it is about (named in its message, or whose value it quotes, or, given ``rebuild``, the
    one without which ``rebuild(config)`` succeeds), its value and the types transformers takes; its own reason
    in one line only when no field can be told."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = re.sub(r"^Validation error for field '\w+': ", "", text)
    text = text if len(text) <= 160 else text[:157] + "..."
    field = _field_of(raw, text) or (_field_without(raw, rebuild) if rebuild else None)
    if field is None:
        return HFError(f"{where}: transformers' {who} refuses this config: {type(e).__name__}: {text}")
    types = re.search(r"doesn't match any type in \((.*?)\)\.", text)
    if types:
        names = [re.sub(r"<class '(?:[\w.]*\.)?(\w+)'>", r"\1", t.strip())
                 for t in re.split(r",\s*(?![^\[]*\])", types[1])]
        rule = "it must be " + " or ".join("null" if n == "NoneType" else n for n in names)
    else:
        rule = f"transformers refuses it ({type(e).__name__}: {text})"
    return HFError(f"{where}: {field} is {shown(_value_at(raw, field))}; {rule} (transformers' {who})")


def _field_of(raw: dict, text: str) -> str | None:
    """The field transformers' message is about: one it names (quoted, backticked), else one whose value it
    quotes (a nested object's as ``rope_scaling.rope_type``)."""
    aliases = {"rope_parameters": "rope_scaling"}  # transformers renames the file's rope_scaling
    for name in re.findall(r"[`'\"](\w+)[`'\"]", text):
        for key in (name, aliases.get(name)):
            if key in raw:
                return key
    for key, value in raw.items():
        pairs = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in pairs:
            if isinstance(v, (str, int, float)) and not isinstance(v, bool) and len(str(v)) >= 3 and (
                    f"'{v}'" in text or f" {v}" in text):
                return key if sub is None else f"{key}.{sub}"
    return None


def _field_without(raw: dict, rebuild) -> str | None:
    """The one field whose absence (transformers' default in its place) lets ``rebuild`` succeed."""
    for key in raw:
        if key == "model_type":
            continue
        try:
            rebuild({k: v for k, v in raw.items() if k != key})
        except Exception:  # noqa: BLE001 - still refused: not this field
            continue
        return key
    return None


def _value_at(raw: dict, field: str) -> Any:
    key, _, sub = field.partition(".")
    return raw[key][sub] if sub else raw[key]


def _check_moe(v: _Values, d: Dims, model_type: str) -> Dims:
    """A mixture of experts' fields: counts, top-k within the experts, layer lists, DeepSeek-V3's groups; and
    the router's auxiliary loss, which transformers computes over the whole batch and all layers at once."""
    count, sizes = _MOE[model_type]
    for name, low, null in sizes:
        v.whole(name, low, null)
    for name, low, high, closed in _MOE_FLOATS:  # a NaN scale would train to a NaN loss, every step
        v.number(name, low, high, closed)
    experts, k = v.get(count), v.get("num_experts_per_tok")
    if k > experts:
        raise v.fail("num_experts_per_tok", f"a token goes to at most {v.key(count)} ({experts}) experts")
    only = v.get("mlp_only_layers")
    if model_type in ("qwen2_moe", "qwen3_moe") and only is not None and not (
            isinstance(only, list) and all(_is_int(x) and 0 <= x < d.layers for x in only)):
        raise v.fail("mlp_only_layers", f"it must list decoder layer numbers 0..{d.layers - 1}")
    if model_type == "deepseek_v3":
        groups, top = v.get("n_group"), v.get("topk_group")
        if experts % groups or experts // groups < 2:
            raise v.fail("n_group", f"it must divide {v.key(count)} ({experts}) into groups of at least 2 experts")
        if top > groups:
            raise v.fail("topk_group", f"a token's experts come from at most n_group ({groups}) groups")
        if k > top * (experts // groups):
            raise v.fail("num_experts_per_tok", f"topk_group ({top}) groups of {experts // groups} experts hold "
                         f"fewer than {k}")
    if v.get("output_router_logits"):
        raise v.fail("output_router_logits", "transformers then adds its load-balancing loss over the whole batch "
                     "and every layer at once, which no pipeline computes (a micro-batch's backward starts before the "
                     "last one's forward); set it false (transformers' default)")
    inner = v.get("intermediate_size") if model_type == "mixtral" else v.get("moe_intermediate_size")
    return dataclasses.replace(d, experts=experts, expert_inner=inner)


def _check_sizes(d: Dims, where: str) -> None:
    within(limits.LAYERS, d.layers + 3, f"{where}: num_hidden_layers {d.layers} makes {d.layers + 3} layers (with "
           "the embedding, final norm and LM head)")
    for what, n in d.tensors():
        within(limits.ELEMENTS, n, f"{where}: {what} = {n}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)
