"""`stagewise train --hf`: a Hugging Face causal LM (folder or config.json) instead of the built-in GPT.

Not a subcommand: ``train.py`` adds these options and hands a ``--hf`` run to
``cmd``, which runs it on ``stagewise.Pipeline`` (stagewise.hf.train): each
rank builds and reads only its own layers.
"""

from __future__ import annotations

import os

from .common import UsageError, int_list, print_json

#: train options that the --hf run does not take
UNSUPPORTED = (("skip_nonfinite", "--skip-nonfinite"),)


def add_args(p) -> None:
    g = p.add_argument_group("Hugging Face model (pip install 'stagewise[hf]')")
    g.add_argument("--hf", metavar="FOLDER_OR_CONFIG", default=None,
                   help="train a transformers causal LM (Llama, Mistral, Qwen2, Qwen3, GPT-2): a local folder "
                   "(config.json + safetensors, sharded or not) or a config.json (random weights); needs --data; "
                   "--seq, --dtype, --seed apply; --save DIR writes an HF folder that from_pretrained loads (with the "
                   "optimizer state, for --resume DIR)")
    g.add_argument("--tokenizer", metavar="FOLDER", default=None,
                   help="a local tokenizer folder for --data (default: byte tokens, which need vocab_size >= 256)")


def check_plain(args) -> None:
    """Without --hf, --tokenizer means nothing."""
    if args.tokenizer and not args.hf:
        raise UsageError("--tokenizer needs --hf (the built-in GPT reads byte tokens)")


def run_config(args):
    """The HFTrain of the parsed options (raises UsageError on a bad combination)."""
    if not args.data:
        raise UsageError("--hf needs --data FILE (a text file to train on)")
    for attr, flag in UNSUPPORTED:
        if getattr(args, attr, None):
            raise UsageError(f"{flag} is not available with --hf")
    if args.resume and args.schedule == "none":
        raise UsageError("--resume needs a --schedule run on ranks; --schedule none keeps no optimizer state")
    from .train import _split, schedule_choice

    _, ranks, reference = schedule_choice(args, world_per_replica=True)
    try:
        from ..hf.data import TextData
        from ..hf.train import HFTrain
    except ImportError as e:
        raise UsageError(f"--hf needs {e.name}: pip install 'stagewise[hf]'") from None
    from ..runtime.run.config import default_batch

    dp, m = args.dp, args.microbatches
    if reference and (dp > 1 or args.recompute or args.recompute_stages):
        raise UsageError("--dp and --recompute need a --schedule run on ranks; --schedule none runs in one process")
    recompute = True if args.recompute else (int_list("--recompute-stages", args.recompute_stages, "stages like 0,2")
                                             or False)
    return HFTrain(source=args.hf, data=TextData(path=args.data, seq=args.seq, tokenizer=args.tokenizer,
                                                  seed=args.seed),
                   schedule=None if reference else args.schedule, csv=args.csv, ranks=ranks, microbatches=m,
                   chunks=args.chunks, split=_split(args.split), dp=dp,
                   recompute=recompute, steps=args.steps, batch=args.batch or default_batch(m, dp), lr=args.lr,
                   optimizer=args.optimizer, clip=args.clip, dtype=args.dtype, seed=args.seed, save=args.save,
                   save_every=args.save_every, resume=args.resume,
                   timeout=args.timeout, timeline=not reference, progress=not args.json)


def cmd(args) -> int:
    """Run ``--hf``; print the summary (rank 0 under torchrun)."""
    from ..runtime import RankFailure, RunError
    from ..runtime.launching.launch import is_torchrun

    cfg = run_config(args)
    from ..hf.train import run

    try:
        res = run(cfg, threads=args.threads)
    except RunError as e:
        raise UsageError(str(e)) from None
    except RankFailure as e:
        if e.user:
            raise UsageError(str(e)) from None
        raise
    if is_torchrun() and os.environ.get("RANK") != "0":
        return 0
    _output(args, cfg, res)
    return 0


def _output(args, cfg, res: dict) -> None:
    from ..timeline import metrics

    tl = res["timeline"]
    name = "none" if cfg.schedule is None and not cfg.csv else (cfg.csv or cfg.schedule)
    out = {"schedule": name, "ranks": 1 if name == "none" else tl.ranks if tl else cfg.ranks,
           "microbatches": cfg.microbatches, "first_step": res["first_step"], "losses": res["losses"],
           "step_time_s": res["step_time_s"],
           "read_bytes_per_rank": res["read_bytes"],
           "measured_bubble_fraction": metrics(tl).bubble_fraction if tl else 0.0, "saved": cfg.save}
    if args.trace and tl is not None:
        from ..render.files import write_timeline

        write_timeline(tl, args.trace)
    if args.json:
        print_json(out)
        return
    times = res["step_time_s"][1:] or res["step_time_s"]
    print(f"{name}: p={out['ranks']} m={cfg.microbatches}, mean step {sum(times) / len(times) * 1e3:.1f} ms, "
          f"measured bubble {out['measured_bubble_fraction']:.1%}")
    print("weights read per rank: " + ", ".join(f"{b / 2**20:.2f} MiB" for b in res["read_bytes"]))
    if args.draw and tl is not None:
        from ..render.ascii import draw_text

        print(draw_text(tl))
    if args.trace and tl is not None:
        print(f"wrote {args.trace} (measured timeline of the last step)")
    if cfg.save:
        print(f"saved {cfg.save} (AutoModelForCausalLM.from_pretrained loads it)")
