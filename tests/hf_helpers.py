"""Tiny Hugging Face causal LMs with random weights, saved to local folders (no hub access).

One per covered family: Llama (grouped-query attention: 4 heads, 2 kv heads),
Mistral (a sliding window shorter than the test sequences), Qwen2 (attention
biases, tied embedding), Qwen3 (q/k norms) and GPT-2 (learned positions, tied
embedding; dropout 0 so a training-mode run is deterministic).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SEQ = 16  #: tokens per test sequence
VOCAB = 256  #: byte-level tokens fit

_LLAMA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "llama": dict(model_type="llama", num_hidden_layers=3, **_LLAMA),
    "mistral": dict(model_type="mistral", num_hidden_layers=2, sliding_window=8, **_LLAMA),
    "qwen2": dict(model_type="qwen2", num_hidden_layers=2, tie_word_embeddings=True, **_LLAMA),
    "qwen3": dict(model_type="qwen3", num_hidden_layers=2, head_dim=32, **_LLAMA),
    "gpt2": dict(model_type="gpt2", vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=64,
                 embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2),
    # mixtures of experts: every layer sparse (Mixtral); sparse every 2nd layer, a gated shared expert
    # (Qwen2-MoE); q/k norms, normalised top-k (Qwen3-MoE); MLA attention, a dense first layer, grouped
    # sigmoid routing, a shared expert (DeepSeek-V3)
    "mixtral": dict(model_type="mixtral", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                    **{**_LLAMA, "intermediate_size": 32}),
    "qwen2_moe": dict(model_type="qwen2_moe", num_hidden_layers=4, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=2, **_LLAMA),
    "qwen3_moe": dict(model_type="qwen3_moe", num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True, head_dim=16, **_LLAMA),
    "deepseek_v3": dict(model_type="deepseek_v3", num_hidden_layers=3, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, n_group=2,
                        topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=16, **{**_LLAMA, "num_key_value_heads": 4}),
}


def hf_config(kind: str, **over):
    from transformers import AutoConfig

    raw = {**CONFIGS[kind], **over}
    return AutoConfig.for_model(raw.pop("model_type"), **raw)


def save_tiny(kind: str, folder: Path, *, seed: int = 0, shard: str | None = None, **over) -> Path:
    """A tiny ``kind`` model with seeded random weights saved to ``folder`` (sharded when ``shard`` is a size)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(kind, **over))
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kw)
    return folder


def hf_model(folder: Path):
    """transformers' own model of ``folder``, in training mode (as a training loop uses it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).train()


def plain_loop(folder: Path, text: str, steps: int, rows: int, seq: int, lr: float):
    """transformers' model trained by hand with SGD: loss per step, step-1 gradients, final parameters (HF names)."""
    from stagewise.hf.data import TextData

    model = hf_model(folder)
    data = TextData(path=text, seq=seq)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads = [], None
    for k in range(steps):
        ids, labels = data.batch(k, rows)
        loss = model(ids, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        if k == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    return losses, grads, model.state_dict()


def batch(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))


def write_config(path: Path, **raw) -> Path:
    path.write_text(json.dumps(raw))
    return path


# ---- rank functions for stagewise.launch (spawned ranks import them from here)

def pipelined_cases(folder: str, text: str, cases, steps: int, batch_rows: int, seq: int, lr: float) -> dict:
    """For each (family, m, v): the HF model through stagewise.Pipeline in a plain SGD loop.

    Rank 0 returns {case: (losses, step-1 gradients by HF name, final full state_dict, every rank's copies of
    the tied parameters after training)} and, per rank, the tensor names its checkpoint reader read.
    """
    import torch.distributed as dist

    from stagewise.hf import load
    from stagewise.hf.data import TextData
    from stagewise.hf.model import _CHECKPOINTS
    from stagewise.hf.pipelined import pipeline

    data = TextData(path=text, seq=seq)
    out, reads = {}, {}
    for case in cases:
        name, m, v, *ep = case  # a fourth item: the experts sharded over that many ranks (pp x ep)
        _CHECKPOINTS.clear()
        model = load(folder)
        pipe = pipeline(model, name, microbatches=m, chunks=v, **({"ep": ep[0]} if ep else {}))
        opt = torch.optim.SGD(pipe.parameters(), lr=lr)
        losses, grads = [], None
        for k in range(steps):
            losses.append(pipe.step(*data.batch(k, batch_rows)).loss)
            if k == 0:
                grads = _gathered({n: p.grad.detach().clone() for n, p in pipe.named_parameters()})
            opt.step()
            opt.zero_grad()
        tied = {n for group in model.ties for n in group}
        copies = _gathered({f"{n}@{k}": p.detach().clone() for k, (n, p) in enumerate(pipe.named_parameters())
                            if n in tied})
        out[case] = (losses, grads, pipe.full_state_dict(), [t for ts in copies.values() for t in ts])
        reads[case] = _all_ranks(sorted(model.checkpoint().read_names))
    dist.barrier()
    return {"cases": out, "reads": reads}


def save_and_logits(folder: str, text: str, out: str, name: str, m: int, seq: int) -> dict:
    """Train one step under ``name``, save as an HF folder, and return the pipeline's logits on a fixed batch."""
    from stagewise.hf import load
    from stagewise.hf.data import TextData
    from stagewise.hf.pipelined import pipeline, save_pretrained

    data = TextData(path=text, seq=seq)
    model = load(folder)
    pipe = pipeline(model, name, microbatches=m)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2)
    pipe.step(*data.batch(0, 2 * m))
    opt.step()
    save_pretrained(pipe, model, out)
    ids = batch(m, seed=7)
    res = pipe.eval().eval_step(ids)
    per_mb = {}  # DualPipe ends its two lanes on two ranks: put the micro-batches back in order
    for mbs, outs in _all_ranks((res.output_mbs, res.outputs)):
        if mbs:
            per_mb.update(zip(mbs, outs.chunk(len(mbs))))
    return {"logits": torch.cat([per_mb[k] for k in range(m)]), "ids": ids}


def each(calls) -> list:
    """Several rank functions in one launch: ``calls`` is [(function, args)]; rank 0's values, in order."""
    return [fn(*args) for fn, args in calls]


def _all_ranks(value) -> list:
    import torch.distributed as dist

    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    return got


def _gathered(named: dict) -> dict:
    """HF name -> every rank's copies of that parameter's tensor."""
    out: dict = {}
    for part in _all_ranks(named):
        for k, v in part.items():
            out.setdefault(k, []).append(v)
    return out


def moe_cases(folders: dict, text: str, cases, steps: int, batch_rows: int, seq: int, lr: float) -> dict:
    """``pipelined_cases`` for several folders: {kind: its cases' results}, each family's read names per rank."""
    def wanted(c, kinds) -> bool:  # "ep" in kinds: the expert-parallel cases too
        return c[0] in kinds if len(c) == 3 else "ep" in kinds

    return {kind: pipelined_cases(folder, text, [c for c in cases if wanted(c, kinds)], steps, batch_rows, seq, lr)
            for kind, (folder, kinds) in folders.items()}
