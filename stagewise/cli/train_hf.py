"""`stagewise train --hf`: a Hugging Face causal LM (folder or config.json) instead of the built-in GPT.

Not a subcommand: ``train.py`` adds these options, and a ``--hf`` run is the same run as any other
(``RunConfig`` -> every rank's ``RankTrainer`` -> ``RunResult``) with ``stagewise.hf.hf_run.HFRun`` as its
model: each rank builds and reads only its own layers; checkpoints are the runtime's, with an HF folder
exported into each step folder.
"""

from __future__ import annotations

from .common import UsageError

#: ``stagewise.hf.hf_run.RANK_IMPORTS``, written here so that the forkserver starts importing them before this
#: process imports torch (held equal by tests/test_hf_cli.py)
RANK_IMPORTS = ("stagewise.hf.hf_run", "transformers.loss.loss_utils", "transformers.masking_utils",
                "transformers.modeling_utils")


def add_args(p) -> None:
    g = p.add_argument_group("Hugging Face model (pip install 'stagewise[hf]')")
    g.add_argument("--hf", metavar="FOLDER_OR_CONFIG", default=None,
                   help="train a transformers causal LM (Llama, Mistral, Qwen2, Qwen3, GPT-2, Mixtral, Qwen2-MoE, Qwen3-MoE, "
                   "DeepSeek-V3) instead of the "
                   "built-in GPT: a local folder (config.json + safetensors, sharded or not) or a config.json "
                   "(random weights); needs --data; --seq, --dtype, --seed apply; --tp uses the model's own "
                   "base_model_tp_plan; --save DIR writes checkpoints (torch.distributed.checkpoint) that resume "
                   "under any schedule, -p, --dp, --fsdp or --tp, each with an HF folder (DIR/step-N/hf) that "
                   "from_pretrained loads")
    g.add_argument("--tokenizer", metavar="FOLDER", default=None,
                   help="a local tokenizer folder for --data (default: byte tokens, which need vocab_size >= 256)")


def check_plain(args) -> None:
    """Without --hf, --tokenizer means nothing."""
    if args.tokenizer and not args.hf:
        raise UsageError("--tokenizer needs --hf (the built-in GPT reads byte tokens)")


def model(args):
    """The ``HFRun`` of the parsed options (raises UsageError on a bad combination)."""
    if not args.data:
        raise UsageError("--hf needs --data FILE (a text file to train on)")
    try:
        from ..hf.hf_run import HFRun
    except ImportError as e:
        raise UsageError(f"--hf needs {e.name}: pip install 'stagewise[hf]'") from None
    return HFRun(source=args.hf, data=args.data, tokenizer=args.tokenizer, seq=args.seq, dtype=args.dtype,
                 seed=args.seed, pack=args.pack)


def check_tp_plan(cfg) -> None:
    """--tp with an HF model runs the model's own plan: one it cannot run is refused before any rank starts
    (after the config's own checks, which read the model)."""
    from ..hf.hf_run import HFRun
    from ..runtime.parallel.tp import check_plan
    from ..runtime.config import RunError

    if not isinstance(cfg.model, HFRun) or cfg.parallelism.tp < 2:
        return
    plan = cfg.model.model().tp_plan
    if plan:  # none: the ranks say `tp` needs a plan, in the same words
        try:
            check_plan(plan, own=True)
        except RunError as e:
            raise UsageError(str(e).replace("`tp` needs", "--tp with --hf needs").replace(
                ", or give `tp_plan` or `parallelize` of your own", " (the Python API takes a `tp_plan` of your own)")) from None


def lines(res) -> list[str]:
    """What an --hf run adds to the summary: the weights each rank read, where the HF folders are."""
    out = []
    if res.read_bytes is not None:
        out.append("weights read per rank: " + ", ".join(f"{b / 2**20:.2f} MiB" for b in res.read_bytes))
    for folder in (res.checkpoint or {}).get("exported", []):  # a model with its own format wrote it there
        out.append(f"exported {folder} (AutoModelForCausalLM.from_pretrained loads it)")
    return out
