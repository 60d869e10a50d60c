"""What a block keeps for its backward, term by term, and what recomputing a module costs.

Korthikanti et al. 2022 (arXiv:2205.05198, Sec. 4) count a GPT block's kept bytes per token: 34 h + 5 a s
at t = 1 (2 bytes per bf16 element, 1 per dropout mask). Here each term is named with where it lives under
tensor parallel and which module's recomputation drops it, so the same list serves GPT, grouped-query and
latent attention, SwiGLU, MoE blocks, selective recomputation by module kind and FP8:

- ``whole``: kept whole on every GPU of a t-group (norm inputs and outputs, dropout masks) unless sequence
  parallel scatters them over the t GPUs;
- ``split``: cut by t (queries, keys, values, the MLP's hidden tensors, attention scores);
- ``latent``: MLA's down-projected latents, computed whole on every GPU (Megatron-Core duplicates the
  down-projections under tensor parallel);
- ``routed``: a routed expert's hidden tensors per token copy (``top_k`` copies x the busiest rank's load),
  spread over every GPU of the stage (cut by t);
- ``routed_input``: a routed copy of the hidden state, held by each of the expert's ``etp`` GPUs.

The modules (Megatron-Core's ``--recompute-modules``): ``core_attn`` (the attention core: its s x s scores;
nothing to drop with flash attention, which keeps none), ``layernorm`` (the two norms' outputs), ``mla_up_proj``
(MLA's up-projected queries, keys and values), ``mlp`` (a dense block's MLP hidden tensors) and ``moe_act``
(the routed experts' activation outputs). ``linear`` marks a linear layer's input: FP8 training keeps those as
FP8 copies (Transformer Engine), the hardware file's ``fp8.activation_factor`` of their bytes.
"""

from __future__ import annotations

from typing import NamedTuple

from .transformer import TransformerSpec

BF16 = 2
#: what selective recomputation may drop, by Megatron-Core's module names
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act")


class Term(NamedTuple):
    """Bytes per token one block keeps at t = 1, where they live and what drops them."""

    name: str
    nbytes: float  #: per token (per routed copy for "routed" and "routed_input")
    group: str  #: whole, split, latent, routed or routed_input (the module doc)
    module: str | None = None  #: the recomputation module that drops it
    linear: bool = False  #: a linear layer's input (FP8 keeps it in FP8)


def terms(spec: TransformerSpec, kind: str) -> list[Term]:
    """The kept terms of one block of ``kind`` ("t" dense, "m" MoE), recomputation off."""
    h = spec.hidden
    out = [Term("norm inputs", 2 * BF16 * h, "whole"),
           Term("attention input", BF16 * h, "whole", "layernorm", True),
           Term("mlp input", BF16 * h, "whole", "layernorm", True)]
    if spec.dropout:  # attention-output and MLP-output dropout masks, a byte each
        out.append(Term("dropout masks", 2 * h, "whole"))
    out += _attention(spec)
    out += _mlp(spec, kind)
    return out


def _attention(spec: TransformerSpec) -> list[Term]:
    m = spec.mla
    qkv = [Term("queries", BF16 * spec.q_dim, "split", "mla_up_proj" if m else None),
           Term("keys", BF16 * spec.kv_dim, "split", "mla_up_proj" if m else None),
           Term("values", BF16 * (spec.v_dim if m else spec.kv_dim), "split", "mla_up_proj" if m else None),
           Term("output projection input", BF16 * spec.v_dim, "split", None, True)]
    if not spec.flash_attention:  # softmax output (2), its dropout mask (1) and output (2) of a x s per token
        qkv.append(Term("attention scores", (2 + (3 if spec.dropout else 0)) * spec.heads * spec.seq, "split",
                        "core_attn"))
    if m is None:
        return qkv
    q = m.q_lora_rank or 0
    latents = [Term("query latent", 2 * BF16 * q, "latent"),  # its norm's input and output (the up-projection's)
               Term("key-value latent", 2 * BF16 * m.kv_lora_rank, "latent"),
               Term("rotary key", BF16 * m.qk_rope_head_dim, "latent")]
    return latents + qkv


def _mlp(spec: TransformerSpec, kind: str) -> list[Term]:
    """A SwiGLU MLP keeps its two input projections' outputs (4 f) and the product (2 f, the down-projection's
    input); a GELU one its first output (2 f) and the activation (2 f)."""
    gate, act = (2 * BF16, BF16) if spec.mlp == "swiglu" else (BF16, BF16)
    if kind == "t":
        return [Term("mlp hidden", gate * spec.ffn, "split", "mlp"),
                Term("mlp activation", act * spec.ffn, "split", "mlp", True)]
    moe, f = spec.moe, spec.moe.expert_ffn
    out = [Term("routed input", BF16 * spec.hidden, "routed_input", None, True),
           Term("routed hidden", gate * f, "routed"),
           Term("routed activation", act * f, "routed", "moe_act", True)]
    if moe.shared_experts:
        out.append(Term("shared experts", (gate + act) * f * moe.shared_experts, "split"))
    return out


def kept_bytes(spec: TransformerSpec, kind: str, tokens: int, t: int, sequence_parallel: bool,
               dropped: frozenset = frozenset(), etp: int | None = None, linear_factor: float = 1.0) -> float:
    """Bytes one block of ``kind`` keeps per micro-batch of ``tokens`` on one GPU of a t-group, without the
    terms of the ``dropped`` modules, linear inputs at ``linear_factor`` (FP8), routed copies held by ``etp``
    GPUs each (default t) at the busiest rank's load.

    >>> s = TransformerSpec.load("gpt3-175b")
    >>> h, a, sq = s.hidden, s.heads, s.seq
    >>> kept_bytes(s, "t", sq, 1, False) == sq * (34 * h + 5 * a * sq)  # Korthikanti et al.'s 34 s b h + 5 a s^2 b
    True
    """
    etp = t if etp is None else etp
    load = spec.moe.load * spec.moe.top_k if kind == "m" else 0.0
    share = {"whole": 1 / t if sequence_parallel else 1.0, "split": 1 / t, "latent": 1.0,
             "routed": load / t, "routed_input": load * etp / t}
    total = 0.0
    for x in terms(spec, kind):
        if x.module in dropped:
            continue
        total += x.nbytes * share[x.group] * (linear_factor if x.linear else 1.0)
    return total * tokens


def dropped_modules(spec: TransformerSpec, kind: str, modules) -> frozenset:
    """Of ``modules``, those that drop something in a block of ``kind`` (core attention only without flash)."""
    have = {x.module for x in terms(spec, kind)}
    return frozenset(m for m in modules if m in have)


def recompute_traffic(spec: TransformerSpec, kind: str, tokens: int, t: int, sequence_parallel: bool,
                      dropped: frozenset) -> float:
    """HBM bytes the element-wise recomputation of the ``dropped`` modules moves in the backward: each redone
    norm or activation reads its input and writes the dropped output again."""
    h, share = spec.hidden, (1 / t if sequence_parallel else 1.0)
    out = 0.0
    if "layernorm" in dropped:
        out += 2 * 2 * BF16 * h * share
    if "moe_act" in dropped and kind == "m":
        f = spec.moe.expert_ffn
        out += spec.moe.load * spec.moe.top_k * 3 * BF16 * f / t
    if "mlp" in dropped and kind == "t":
        out += 3 * BF16 * spec.ffn / t
    return out * tokens


def recompute_flops(spec: TransformerSpec, kind: str, tokens: int, dropped: frozenset) -> float:
    """Matrix-multiply FLOPs (t = 1) the recomputation of the ``dropped`` modules redoes: MLA's up-projections,
    a dense MLP's three (two for GELU) multiplies."""
    out = spec.up_projection_flops(tokens) if "mla_up_proj" in dropped else 0.0
    if "mlp" in dropped and kind == "t":
        out += 2.0 * tokens * (3 if spec.mlp == "swiglu" else 2) * spec.hidden * spec.ffn
    return out
