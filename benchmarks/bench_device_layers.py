"""On a lent GPU: one block of today's models, measured against the planner's analytic cost of the same block.

Run (on the device machine, whose python3 holds a CUDA torch and transformers; stagewise itself is pure
Python and needs no install there):

    PYTHONPATH=. python3 benchmarks/bench_device_layers.py --json $OUT/device_layers.json

and here, on CPU with tiny widths (what the test suite runs, so the script cannot rot between loans):

    .venv/bin/python benchmarks/bench_device_layers.py --tiny

Each case writes an HF config with a shipped model's widths and two blocks, measures it with
``stagewise.profiling.measure.profile_model`` (each layer alone, the median of timed F and B, and the
bytes autograd saves), and prices the same config with the cluster planner's ``analytic_profile`` on the
``h100`` hardware file (tensor parallel 1, no recomputation). Printed per block and micro-batch size:
measured / predicted F, B and kept bytes, and the tokens each routed expert multiplies.

Why these cases: the planner prices a routed expert's multiplies at one efficiency whatever their size, and
bench_published.py's Qwen3-235B rows disagree with each other by up to 70% where the tokens per expert
differ (512 at TP 4 and EP 8, 4,096 at TP 2 and EP 32: an EP rank's 16 or 4 local experts). A model with
``experts`` local experts and ``top_k`` routing does on one GPU the multiplies one EP rank does; the dense
Llama 3 block is the reference the MoE ratios are read against. The planner's efficiencies are fitted to whole
published steps, so a ratio well under 1 is expected for every case; how the ratio moves with the tokens per
expert is the finding.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from stagewise.plan.cluster import Hardware, TensorParallel, TransformerSpec, analytic_profile


class Case(NamedTuple):
    model: str  #: a shipped model file
    seq: int  #: tokens per sequence
    micro_batch_sizes: tuple[int, ...]
    experts: int | None = None  #: local experts (None: the model's own, or dense)
    top_k: int | None = None


CASES = (
    Case("llama3-8b", 4096, (1, 2)),
    # one EP rank of Qwen3-235B: 16 local experts under top-8 (EP 8), 4 under top-4 (EP 32's 4 local experts)
    Case("qwen3-235b-a22b", 1024, (1, 2, 4), experts=16, top_k=8),
    Case("qwen3-235b-a22b", 1024, (1, 2, 4), experts=4, top_k=4),
)
#: --tiny: the same structure at widths a CPU measures in seconds
TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256)


def spec_for(case: Case, tiny: bool) -> TransformerSpec:
    """The shipped model's spec, cut to two blocks at the case's sequence and local experts."""
    spec = TransformerSpec.load(case.model)
    # only the blocks are compared: a small vocabulary keeps the embedding and head under stagewise.limits
    spec = replace(spec, layers=2, seq=16 if tiny else case.seq, **(TINY if tiny else {"vocab": 32768}))
    if spec.moe is not None:
        moe = replace(spec.moe, experts=case.experts or spec.moe.experts, top_k=case.top_k or spec.moe.top_k,
                      expert_ffn=32 if tiny else spec.moe.expert_ffn)
        spec = replace(spec, moe=moe)
    return spec


def hf_config(spec: TransformerSpec) -> dict:
    """An HF config.json of the spec: Llama for a dense model, Qwen3-MoE (every block sparse) for an MoE one."""
    raw = dict(vocab_size=spec.vocab, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
               num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads, head_dim=spec.head_size,
               intermediate_size=spec.ffn, max_position_embeddings=spec.seq, tie_word_embeddings=False,
               rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
    if spec.moe is None:
        return dict(model_type="llama", **raw)
    return dict(model_type="qwen3_moe", num_experts=spec.moe.experts, num_experts_per_tok=spec.moe.top_k,
                moe_intermediate_size=spec.moe.expert_ffn, norm_topk_prob=True, decoder_sparse_step=1, **raw)


def measure(spec: TransformerSpec, sizes: tuple[int, ...], device: str, dtype: str, repeats: int):
    from stagewise.hf.hf_run import HFRun
    from stagewise.profiling.measure import profile_model

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(hf_config(spec)))
        return profile_model(HFRun(source=str(path), seq=spec.seq, dtype=dtype), sizes, repeats=repeats,
                             device=device)


def first_block(profile):
    return next(layer for layer in profile.layers if layer.symbol in ("t", "m"))


def rows(case: Case, tiny: bool, device: str, dtype: str, repeats: int) -> list[dict]:
    spec = spec_for(case, tiny)
    sizes = case.micro_batch_sizes[:2] if tiny else case.micro_batch_sizes
    got = first_block(measure(spec, sizes, device, dtype, repeats))
    want = first_block(analytic_profile(spec, Hardware.load("h100"), TensorParallel(t=1, sequence_parallel=False),
                                        sizes))
    out = []
    for k, b in enumerate(sizes):
        per_expert = spec.seq * b * spec.moe.top_k / spec.moe.experts if spec.moe else None
        out.append(dict(model=case.model, seq=spec.seq, mbs=b, experts=spec.moe.experts if spec.moe else None,
                        top_k=spec.moe.top_k if spec.moe else None, tokens_per_expert=per_expert,
                        f=(got.t_f[k], want.t_f[k]), b=(got.t_b[k], want.t_b[k]),
                        kept=(got.activation_bytes[k], want.activation_bytes[k])))
    return out


def table(results: list[dict]) -> str:
    lines = [f"{'case':<34}{'mbs':>4}{'tok/expert':>11}   {'F ms meas/pred':>20}   {'B ms meas/pred':>20}"
             f"   {'kept MiB meas/pred':>24}"]
    for r in results:
        name = r["model"] + (f" {r['experts']} experts top-{r['top_k']}" if r["experts"] else "") + f" s{r['seq']}"
        tok = f"{r['tokens_per_expert']:.0f}" if r["tokens_per_expert"] else "-"
        cells = []
        for key, scale in (("f", 1e3), ("b", 1e3), ("kept", 2.0 ** -20)):
            got, want = r[key]
            cells.append(f"{got * scale:8.2f}/{want * scale:<8.2f} x{got / want:5.2f}")
        lines.append(f"{name:<34}{r['mbs']:>4}{tok:>11}   " + "   ".join(cells))
    return "\n".join(lines)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny widths on CPU in float32 (a smoke run)")
    ap.add_argument("--device", default=None, help="default cuda, or cpu with --tiny")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per layer (median); default 10, 1 tiny")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    device = args.device or ("cpu" if args.tiny else "cuda")
    dtype = "float32" if args.tiny else "bfloat16"
    repeats = args.repeats or (1 if args.tiny else 10)
    if device.startswith("cuda") and not _has_cuda():
        print("no CUDA device here: this check runs on a lent GPU (see the docstring); --tiny runs it on CPU")
        return 0
    results = [r for case in CASES for r in rows(case, args.tiny, device, dtype, repeats)]
    print(f"device {device}, {dtype}; predicted: the planner's analytic profile on the h100 file (t=1, no recompute)")
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
