"""`stagewise train --hf`: a Hugging Face causal LM (folder or config.json) instead of the built-in GPT.

Not a subcommand: ``train.py`` adds these options; ``apply`` swaps the run's model.
"""

from __future__ import annotations

import dataclasses

from .common import UsageError


def add_args(p) -> None:
    g = p.add_argument_group("Hugging Face model (pip install 'stagewise[hf]')")
    g.add_argument("--hf", metavar="FOLDER_OR_CONFIG", default=None,
                   help="train a transformers causal LM (Llama, Mistral, Qwen2, Qwen3, GPT-2): a local folder "
                   "(config.json + safetensors, sharded or not) or a config.json (random weights); needs --data; "
                   "--seq, --dtype and --seed apply, the built-in GPT's --layers/--d-model/--heads/--vocab do not")
    g.add_argument("--tokenizer", metavar="FOLDER", default=None,
                   help="a local tokenizer folder for --data (default: byte tokens, which need vocab_size >= 256)")


def apply(cfg, args):
    """``cfg`` with the HF model when ``--hf`` is given."""
    if args.tokenizer and not args.hf:
        raise UsageError("--tokenizer needs --hf (the built-in GPT reads byte tokens)")
    if not args.hf:
        return cfg
    if not args.data:
        raise UsageError("--hf needs --data FILE (a text file to train on)")
    try:
        from ..hf.data import TextData
        from ..hf.run import HFRun
    except ImportError as e:
        raise UsageError(f"--hf needs {e.name}: pip install 'stagewise[hf]'") from None
    data = TextData(path=args.data, seq=args.seq, tokenizer=args.tokenizer, seed=args.seed)
    return dataclasses.replace(cfg, model=HFRun(source=args.hf, data=data, dtype=args.dtype, seed=args.seed))
