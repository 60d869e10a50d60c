"""Packed vs padded training of the same documents, side by side in one run.

The documents' lengths follow BERT's Wikipedia pre-training set at sequence length 512 (Krell et al.,
"Efficient Sequence Packing without Cross-contamination", arXiv:2107.02027; the histogram published with it,
graphcore/tutorials blogs_code/packedBERT/histograms.py; stagewise/data/wikipedia.py), scaled to --seq: a
long tail (23% of the sequences at the limit, the mode near a quarter of it), half padding at 512.
Their tokens are windows of the built-in GPT's synthetic stream.

- padded: one document per row of --seq tokens, the rest padding (targets -100, causal attention);
- packed: the same documents packed into rows of --seq (stagewise.data: first-fit-decreasing, positions per
  document, attention within each document), so fewer rows, hence fewer steps of the same batch.

Both run as one pipeline each (the built-in GPT, p ranks, m micro-batches, the same batch of rows per step) in
one process group, stepped alternately (who goes first alternates), so load from other processes hits both
alike. Step time is barrier to after the optimizer step, step 0 excluded (warm-up). tokens/s is real tokens
per step over its time; the ratio is the median over the rounds where both stepped of packed's tokens/s over
padded's (each mode's own median is shown too). Both modes see every document once (packed has fewer rows,
so it takes fewer steps, and its rounds end first).

    .venv/bin/python benchmarks/bench_packing.py [--documents 384] [--seq 256] [--d-model 128] [-p 2] [-m 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from dataclasses import dataclass

from stagewise.runtime.run.models import GPTConfig


@dataclass(frozen=True, kw_only=True)
class Corpus(GPTConfig):
    """The built-in GPT over a fixed set of documents, as padded rows or as packed rows (``mode``)."""

    mode: str = "packed"  #: "packed" or "padded"
    documents: int = 384
    rows_per_step: int = 16

    def lengths(self) -> list[int]:
        from stagewise.data import wikipedia

        rng = random.Random(self.seed)
        return [wikipedia.length(rng, self.seq) for _ in range(self.documents)]

    def all_rows(self):
        """Every row of the corpus: (inputs, targets); padded rows are plain ids, packed ones the packer's dict."""
        import torch

        from stagewise.data import pack
        from stagewise.data.tensors import IGNORE, build
        from stagewise.runtime.run.models import _stream

        lengths, stream = self.lengths(), _stream(self)
        rng = random.Random(self.seed + 1)
        windows = [stream[s:s + n + 1] for n in lengths for s in [rng.randrange(len(stream) - n)]]
        if self.mode == "packed":
            plan = pack(lengths, self.seq, argument="seq")
            return build(plan, [w[:-1] for w in windows], [w[1:] for w in windows])
        ids = torch.zeros(len(lengths), self.seq, dtype=torch.long)
        tgt = torch.full((len(lengths), self.seq), IGNORE, dtype=torch.long)
        for r, (n, w) in enumerate(zip(lengths, windows)):
            ids[r, :n], tgt[r, :n] = w[:-1], w[1:]
        return ids, tgt

    def steps(self) -> int:
        """Whole steps of ``rows_per_step`` rows (a last partial step is left out of both modes' timing)."""
        rows = self.all_rows()[1].shape[0]
        return rows // self.rows_per_step

    def batch(self, step: int, size: int, shares=(1, 1)):
        x, y = _ROWS.setdefault((self.mode, self), self.all_rows())
        cut = slice(step * size, (step + 1) * size)
        return ({k: v[cut] for k, v in x.items()} if isinstance(x, dict) else x[cut]), y[cut]


_ROWS: dict = {}


def rank_main(args) -> dict:
    """One rank: both pipelines side by side, stepped alternately."""
    import torch
    import torch.distributed as dist

    from stagewise.data.tensors import tokens
    from stagewise.runtime.config import RunConfig
    from stagewise.runtime.run.worker import Env, RankTrainer

    rank, world = dist.get_rank(), dist.get_world_size()
    env = Env(rank=rank, world=world, device=torch.device("cpu"), backend="gloo")
    out, trainers, models = {}, {}, {}
    for mode in ("padded", "packed"):
        model = Corpus(layers_n=args.layers, d_model=args.d_model, heads=4, seq=args.seq, vocab=64, mode=mode,
                       documents=args.documents, rows_per_step=args.batch, pack=(mode == "packed"))
        models[mode] = model
        cfg = RunConfig(schedule=args.schedule, ranks=world, microbatches=args.m, batch=args.batch,
                        steps=model.steps(), model=model, lr=1e-3, measure_memory=False)
        trainers[mode] = RankTrainer(env, cfg)
        out[mode] = {"steps": cfg.steps, "seconds": [], "tokens": [], "places": []}
    for k in range(max(o["steps"] for o in out.values())):
        order = ("padded", "packed") if k % 2 else ("packed", "padded")
        for mode in order:
            if k >= out[mode]["steps"]:
                continue
            _, sec = trainers[mode].step(k)
            real, places = tokens(models[mode].batch(k, args.batch)[1])
            rec = out[mode]
            rec["tokens"].append(real)
            rec["places"].append(places)
            rec["seconds"].append(sec)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", type=int, default=2, help="ranks (default 2: one per core of a 2-core machine)")
    ap.add_argument("-m", type=int, default=4)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--batch", type=int, default=16, help="rows per step, both modes")
    ap.add_argument("--documents", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (+ embedding and head)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=256, help="the token budget of a row")
    args = ap.parse_args()
    from stagewise import launch

    t = time.time()
    out = launch(rank_main, args.p, args, threads=1, timeout=900)
    print(f"{args.documents} documents, lengths from BERT's Wikipedia histogram (Krell et al. 2021) scaled to "
          f"seq={args.seq}; GPT {args.layers} blocks d_model={args.d_model}; {args.schedule} p={args.p} m={args.m}, "
          f"{args.batch} rows per step; gloo, 1 thread per rank ({time.time() - t:.0f} s in all)")
    head = f"{'mode':<7} {'rows':>5} {'steps':>5} {'padding':>8} {'tokens/step':>11} {'step s':>7} {'tokens/s':>9}"
    print(head)
    print("-" * len(head))
    rate = {}
    for mode, rec in out.items():
        timed = slice(1, None) if rec["steps"] > 1 else slice(None)
        per_s = [t / s for t, s in zip(rec["tokens"][timed], rec["seconds"][timed])]
        rate[mode] = statistics.median(per_s)
        pad = 1 - sum(rec["tokens"]) / sum(rec["places"])
        rec["padding"] = pad
        print(f"{mode:<7} {rec['steps'] * args.batch:>5} {rec['steps']:>5} {pad:>8.1%} "
              f"{statistics.median(rec['tokens']):>11.0f} {statistics.median(rec['seconds'][timed]):>7.3f} "
              f"{rate[mode]:>9.0f}")
    removed = out["padded"]["padding"] - out["packed"]["padding"]
    pa, pp = out["packed"], out["padded"]
    ratios = [(pa["tokens"][k] / pa["seconds"][k]) / (pp["tokens"][k] / pp["seconds"][k])
              for k in range(1, min(pa["steps"], pp["steps"]))]
    print(f"packed / padded tokens/s: {statistics.median(ratios):.2f}x (median of {len(ratios)} rounds' ratios; "
          f"of the medians {rate['packed'] / rate['padded']:.2f}x); padding {pp['padding']:.1%} -> "
          f"{pa['padding']:.1%} ({removed * 100:.1f} points removed)")


if __name__ == "__main__":
    main()
