"""A checkpoint manifest: its shape (checked before anything trusts it) and the run it names.

The ``run`` section says what was trained, independent of the schedule, p and
dp it was saved under: a run id (kept by every resume of the run, so a resumed
run may save into its own folder), the model (its options, or its dataclass
fields), the parameter count, the seed and the data (synthetic, or a file's
size and SHA-256), and the optimizer settings. ``--resume`` refuses a
checkpoint whose model, seed or data differ, saying which; ``--save`` refuses
a folder holding another run's checkpoints unless ``--overwrite``.

No torch here: these checks run before any rank starts.

Example::

    >>> problem({"format": "stagewise-checkpoint/3", "step": -5}, "step-00000002")
    'step must be an integer >= 1; got -5'
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import stat
import uuid
from typing import Any, Callable, NamedTuple

FORMAT = "stagewise-checkpoint/3"  #: a DCP checkpoint (checkpoint.py)
LAYERS_FORMAT = "stagewise-checkpoint/2"  #: an earlier stagewise's layer-keyed files, read only (checkpoint_layers.py)
#: the only names a manifest may list (no paths): DCP's files, RNG states, an earlier format's layer files
FILE_NAME = re.compile(r"(layer|rng-rank)-\d{5}\.pt|__\d+_\d+\.distcp|\.metadata")


class Rule(NamedTuple):
    """A leaf of the schema: a test and what it asks for, in words."""

    ok: Callable[[Any], bool]
    says: str


class MapOf(NamedTuple):
    """A JSON object of any keys passing ``key``, each value of shape ``value``."""

    key: Rule
    value: Any


def _int(low: int) -> Rule:
    return Rule(lambda v: type(v) is int and v >= low, f"an integer >= {low}")


STR = Rule(lambda v: isinstance(v, str), "a string")
SCALAR = Rule(lambda v: v is None or type(v) in (str, int, float, bool), "a string, number, boolean or null")
SHA256 = Rule(lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None, "a hex SHA-256")
RUN_ID = Rule(lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{32}", v) is not None, "a run id (32 hex)")
SHAPE = Rule(lambda v: isinstance(v, list) and all(type(d) is int and d >= 0 for d in v), "a list of sizes")

#: the manifest's shape: dicts are objects with these keys (more keys are allowed), leaves are rules
SCHEMA = {
    "format": Rule(lambda v: v in (FORMAT, LAYERS_FORMAT), repr(FORMAT)),
    "step": _int(1), "world": _int(1), "optimizer": STR, "layers": _int(1), "saved_at": STR,
    "layout": {"schedule": STR, "ranks": _int(1), "replicas": _int(1), "microbatches": _int(1), "stages": _int(1)},
    "data": {"next_step": _int(1), "batch": _int(1), "sequences": _int(0)},
    "params": MapOf(STR, {"layer": _int(0), "shape": SHAPE, "dtype": STR}),
    "files": MapOf(Rule(lambda k: FILE_NAME.fullmatch(k) is not None, "a checkpoint file name"),
                   {"bytes": _int(0), "sha256": SHA256}),
    "run": {"id": RUN_ID, "model": MapOf(STR, SCALAR), "parameters": _int(0), "seed": SCALAR,
            "data": MapOf(STR, SCALAR), "training": MapOf(STR, SCALAR)},
}


#: optional sections, checked when present: the export folder's files (checkpoint.py writes it for an HF run)
OPTIONAL = {"export": MapOf(Rule(lambda k: isinstance(k, str) and re.fullmatch(r"\w[\w.-]*", k) is not None,
                                 "a file name"), {"bytes": _int(0)})}


def problem(manifest: Any, folder_name: str) -> str:
    """What is wrong with a manifest read from ``folder_name`` ('' when it has the schema's shape and types)."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("format") not in (FORMAT, LAYERS_FORMAT):
        return f"not a {FORMAT} manifest (format {manifest.get('format')!r})"
    why = _check(manifest, SCHEMA, "") or next(
        (w for k, spec in OPTIONAL.items() if k in manifest for w in [_check(manifest[k], spec, k)] if w), "")
    if why:
        return why
    if folder_name.startswith("step-") and folder_name != f"step-{manifest['step']:08d}":
        return f"step {manifest['step']} in a folder named {folder_name}"
    return ""


def _check(value: Any, spec: Any, where: str) -> str:
    if isinstance(spec, Rule):
        return "" if spec.ok(value) else f"{where} must be {spec.says}; got {_short(value)}"
    if not isinstance(value, dict):
        return f"{where or 'the manifest'} must be a JSON object; got {_short(value)}"
    if isinstance(spec, MapOf):
        for key, item in value.items():
            if not spec.key.ok(key):
                return f"{where}: {_short(key)} is not {spec.key.says}"
            why = _check(item, spec.value, f"{where}[{key!r}]")
            if why:
                return why
        return ""
    for key, sub in spec.items():
        if key not in value:
            return f"{where + '.' if where else ''}{key} is missing"
        why = _check(value[key], sub, f"{where + '.' if where else ''}{key}")
        if why:
            return why
    return ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- the run a checkpoint belongs to


def new_run_id() -> str:
    return uuid.uuid4().hex


def model_identity(model) -> dict:
    """What the model is, as option -> value: ``model.identity()``, or its dataclass fields (seed and data
    apart: they are the run's, see ``run_section``), or only its class."""
    if hasattr(model, "identity"):
        fields = dict(model.identity())
    elif dataclasses.is_dataclass(model):
        fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in ("seed", "data")}
    else:
        fields = {}
    scalars = {k: v for k, v in fields.items() if v is None or type(v) in (str, int, float, bool)}
    return {"class": type(model).__name__, **scalars}


def data_identity(model) -> dict:
    """Where the batches come from: the synthetic stream, or a file by size and SHA-256 (a moved file is the
    same data; an edited one is not)."""
    path = getattr(model, "data", None)
    if path is None:
        return {"source": "synthetic"}
    if not isinstance(path, (str, os.PathLike)):
        return {"source": type(path).__name__}
    digest = hashlib.sha256()
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
            raise OSError("not a regular file")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:  # the model's own check names an unreadable file; here it is only not the same data
        return {"source": "file", "path": os.path.abspath(path)}
    return {"source": "file", "path": os.path.abspath(path), "bytes": os.path.getsize(path),
            "sha256": digest.hexdigest()}


def run_section(cfg, run_id: str, params: dict, optimizer: str) -> dict:
    """The manifest's ``run``: id, model, parameter count (from ``params``' shapes), seed, data, training."""
    seed = getattr(cfg.model, "seed", None)
    return {"id": run_id, "model": model_identity(cfg.model),
            "parameters": sum(math.prod(p["shape"]) for p in params.values()),
            "seed": seed if seed is None or type(seed) in (int, float, str) else str(seed),
            "data": data_identity(cfg.model),
            "training": {"optimizer": optimizer, "lr": cfg.lr, "batch": cfg.batch, "clip": cfg.clip}}


def differences(run: dict, cfg) -> list[str]:
    """How the run of ``cfg`` differs from a checkpoint's ``run`` in model, seed or data ([] when it does not).

    The schedule, p, dp, batch and optimizer settings may differ: a checkpoint resumes under any of them.
    """
    out = []
    theirs, ours = run["model"], model_identity(cfg.model)
    for key in sorted(set(theirs) | set(ours), key=lambda k: (k != "class", k)):
        if theirs.get(key) != ours.get(key):
            out.append(f"{_option(key)} {_value(theirs.get(key))} there, {_value(ours.get(key))} here")
    seed = getattr(cfg.model, "seed", None)
    if run["seed"] != seed:
        out.append(f"`seed` {run['seed']} there, {seed} here")
    data = data_identity(cfg.model)
    if (run["data"].get("source"), run["data"].get("sha256")) != (data.get("source"), data.get("sha256")):
        out.append(f"`data` {_data(run['data'])} there, {_data(data)} here")
    return out


def _option(key: str) -> str:
    return "model class" if key == "class" else key


def _value(v) -> str:
    return "(none)" if v is None else str(v)


def _data(d: dict) -> str:
    if d.get("source") == "file":
        return f"{d.get('path')} ({d.get('bytes')} bytes, SHA-256 {str(d.get('sha256'))[:12]}...)"
    return str(d.get("source"))
