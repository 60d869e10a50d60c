"""The CLI's words for the library's arguments: library errors name `microbatches`, the CLI says -m.

``say`` is applied to every user error the CLI prints (cli/__init__.py), so a library message written
once (stagewise/errors.py) reads in each front end's own vocabulary. A name with no flag here is printed
as it is (without backticks).
"""

from __future__ import annotations

from dataclasses import fields

from ..errors import translate
from ..parallelism import Parallelism

#: library argument (RunConfig, GPTConfig, Pipeline, the HF adapter, the planner) -> CLI flag
FLAGS = {
    # the schedule and the ranks (RunConfig, Pipeline, generate)
    "schedule": "--schedule", "csv": "--csv", "ranks": "--ranks", "microbatches": "--microbatches",
    "chunks": "--chunks",
    # the layout's degrees and options, from Parallelism's fields (pp is -p/--ranks)
    **{f.name: f.metadata["flag"] for f in fields(Parallelism)},
    "split": "--split", "layout": "--layout", "recompute": "--recompute/--recompute-stages",
    # the run
    "steps": "--steps", "batch": "--batch", "lr": "--lr", "optimizer": "--optimizer", "clip": "--clip",
    "timeout": "--timeout", "threads": "--threads", "save": "--save", "save_every": "--save-every",
    "resume": "--resume", "overwrite": "--overwrite", "skip_nonfinite": "--skip-nonfinite",
    "nonfinite": "--skip-nonfinite", "save_on_signal": "--save-on-signal", "max_restarts": "--max-restarts",
    "elastic": "--elastic",
    # the built-in GPT (GPTConfig)
    "layers_n": "--layers", "d_model": "--d-model", "heads": "--heads", "seq": "--seq", "vocab": "--vocab",
    "dtype": "--dtype", "data": "--data", "seed": "--seed",
    "moe_experts": "--moe-experts", "moe_top_k": "--moe-top-k", "moe_shared": "--moe-shared",
    "moe_capacity": "--moe-capacity", "moe_pad": "--moe-pad", "moe_aux": "--moe-aux",
    # the Hugging Face adapter
    "source": "--hf", "tokenizer": "--tokenizer",
    # profile, plan
    "micro_batch_sizes": "--micro-batch-sizes", "verify": "--verify", "memory": "--memory",
}


def say(message: str) -> str:
    """A library message in the CLI's words."""
    return translate(message, FLAGS)
