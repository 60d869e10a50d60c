"""The CLI's words for the library's arguments: library errors name `microbatches`, the CLI says -m.

``say`` is applied to every user error the CLI prints (cli/__init__.py), so a library message written
once (stagewise/errors.py) reads in each front end's own vocabulary. A name with no flag here is printed
as it is (without backticks). ``add_layout_options`` makes every command's layout options from
``Parallelism``'s fields, so a degree has one flag and one help wherever it is taken.
"""

from __future__ import annotations

from dataclasses import fields

from .errors import translate
from .parallelism import Parallelism

#: library argument (RunConfig, GPTConfig, Pipeline, the HF adapter, the planner) -> CLI flag
FLAGS = {
    # the schedule and the ranks (RunConfig, Pipeline, generate)
    "schedule": "--schedule", "csv": "--csv", "ranks": "--ranks", "microbatches": "--microbatches",
    "chunks": "--chunks", "slices": "--slices",
    # the layout's degrees and options, from Parallelism's fields (pp is -p/--ranks)
    **{f.name: f.metadata["flag"] for f in fields(Parallelism)},
    # the degrees the cluster planner tries (Job), said as the fields' flags
    "tensor": "--tp", "pipeline": "--ranks", "expert": "--ep", "expert_tensor": "--etp",
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


#: the planner's earlier flags for the degrees it tries, still parsed; each sets the attribute named as the
#: ``Job`` argument (``planner_dest``), which its errors name: the field's flag in FLAGS
PLANNER_ALIASES = {"tp": "--tensor", "pp": "--pipeline", "ep": "--expert", "etp": "--expert-tensor"}


def planner_dest(name: str) -> str:
    """The parsed attribute (and the ``Job`` argument) of field ``name``'s degrees to try: tp -> tensor."""
    return PLANNER_ALIASES[name][2:].replace("-", "_")


def add_layout_options(group, names, *, defaults: bool | dict = False, more: dict | None = None,
                       tried: dict | None = None) -> None:
    """``names`` (``Parallelism`` fields) as options of ``group``, each with its field's flags (``-p``/``--ranks``
    for pp) and help (``more`` adds a command's own words): a whole number >= 1, ``zero`` 0 or 1, a bool a
    switch. ``defaults``: True the field's default, a dict a command's own (else None: the options say only what
    was given). ``tried``: the planner's form, each a comma-separated list of degrees to try (its metavar here),
    with its ``PLANNER_ALIASES`` flag."""
    from .option_values import positive_int

    by_name = {f.name: f for f in fields(Parallelism)}
    for name in names:
        f = by_name[name]
        default = defaults.get(name) if isinstance(defaults, dict) else f.default if defaults else None
        kw = dict(help=f.metadata["help"] + (f"; {more[name]}" if name in (more or {}) else ""), default=default)
        if tried is not None:
            alias = PLANNER_ALIASES[name]
            kw.update(dest=planner_dest(name), metavar=tried[name], default=None)
        elif f.type in (bool, "bool"):
            kw.update(action="store_true")
        elif name == "zero":
            kw.update(type=int, choices=(0, 1))
        else:
            kw.update(type=positive_int)
        group.add_argument(*f.metadata.get("short", ()), f.metadata["flag"], *([alias] if tried is not None else []),
                           **kw)
