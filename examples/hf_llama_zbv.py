"""A Hugging Face Llama trained on a text file under ZB-V on 2 local ranks, saved, loaded back and sampled.

    python examples/hf_llama_zbv.py                       # a tiny random Llama on README.md's bytes
    python examples/hf_llama_zbv.py --model PATH --data FILE --tokenizer PATH --out trained
    torchrun --nproc-per-node 2 examples/hf_llama_zbv.py  # the same, as 2 torchrun ranks

Without --model it writes a tiny Llama (2 decoder layers, hidden 64, grouped-query
attention with 4 heads and 2 kv heads, byte vocabulary) with random weights to
./tiny-llama: nothing is downloaded. With --model, a folder you downloaded
(config.json + *.safetensors): each rank reads only its own layers' tensors.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import stagewise
from stagewise.hf import load
from stagewise.hf.data import TextData
from stagewise.hf.pipelined import pipeline, save_pretrained


def tiny_llama(folder: Path) -> Path:
    """A tiny random Llama saved as an HF folder (what a downloaded model folder looks like)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tmp = folder.with_name(folder.name + ".part")
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(tmp)
    os.replace(tmp, folder)  # appears whole: another rank may be waiting for it
    return folder


def main(args) -> dict:
    """One rank: this rank's layers of the model under zb-v, a plain AdamW loop, then an HF folder."""
    model = load(args.model)
    data = TextData(path=args.data, seq=args.seq, tokenizer=args.tokenizer)
    data.check(model.config)
    pipe = pipeline(model, "zb-v", microbatches=4)
    opt = torch.optim.AdamW(pipe.parameters(), lr=args.lr)
    losses = []
    for k in range(args.steps):
        losses.append(pipe.step(*data.batch(k, 8)).loss)
        pipe.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()
    save_pretrained(pipe, model, args.out)
    if dist.get_rank() == 0:
        print(f"zb-v on 2 ranks: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps; saved {args.out}")
    return {"first": losses[0], "last": losses[-1]}


def sample(args) -> str:
    """The saved folder, loaded by transformers itself, continues a prompt (greedy)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.out).eval()
    prompt = Path(args.data).read_bytes()[:16]
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        ids = tok(prompt.decode("utf-8", "replace"), return_tensors="pt").input_ids
        return tok.decode(model.generate(ids, max_new_tokens=40, do_sample=False)[0])
    ids = torch.tensor([list(prompt)])
    out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0)[0].tolist()
    return bytes(out).decode("utf-8", "replace")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an HF model folder; default: write a tiny random Llama")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "README.md"))
    ap.add_argument("--tokenizer", default=None, help="a local tokenizer folder (default: byte tokens)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", default="trained-llama")
    return ap.parse_args()


if __name__ == "__main__":
    args = parse()
    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun this process is one rank
    if args.model is None:
        args.model = str(Path("tiny-llama").resolve())
        if rank0 and not Path(args.model).exists():
            tiny_llama(Path(args.model))
        while not Path(args.model).exists():  # torchrun's other rank waits for rank 0's folder
            time.sleep(0.1)
    stagewise.launch(main, 2, args)
    if rank0:
        print("sample:", repr(sample(args)))
