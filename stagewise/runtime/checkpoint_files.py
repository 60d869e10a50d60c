"""A checkpoint folder on disk: atomic files, a manifest written last, and finding the newest complete one.

``--save DIR`` writes ``DIR/step-00000004/`` after step 4: ``layer-00003.pt``
per model layer (that layer's parameters and their optimizer state, keyed by
logical parameter name), ``rng-rank-00001.pt`` per rank, and ``manifest.json``
last. Every file is written to a temporary name in the same folder, fsynced,
then renamed over its final name (``os.replace`` is atomic), and the folder is
fsynced. The manifest lists each file with its size and SHA-256, so a folder
without a manifest is a save that did not finish, and a file that differs
from its entry is corrupt: neither ever loads. ``--resume DIR`` takes the
newest complete step folder under DIR (saying which incomplete ones it
skipped), or exactly the step folder it is given.

No torch here: the launcher runs these checks before any rank starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .config import RunError

FORMAT = "stagewise-checkpoint/1"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"step-(\d{8})")


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` steps."""
    return Path(root) / f"step-{step:08d}"


def layer_file(layer: int) -> str:
    return f"layer-{layer:05d}.pt"


def rng_file(rank: int) -> str:
    return f"rng-rank-{rank:05d}.pt"


def atomic_write(path: Path, data: bytes) -> dict:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never a part.

    Returns the manifest entry of the file: its size and SHA-256.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_manifest(folder: Path, manifest: dict) -> None:
    atomic_write(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())


def drop_manifest(folder: Path) -> None:
    """Mark ``folder`` incomplete before its files are rewritten (a save over an older save of that step)."""
    try:
        (folder / MANIFEST).unlink()
    except FileNotFoundError:
        return
    fsync_dir(folder)


def read_verified(folder: Path, name: str, manifest: dict, option: str = "--resume") -> bytes:
    """The bytes of ``name``, checked against its manifest entry (``RunError`` when it differs)."""
    entry = manifest["files"].get(name)
    if entry is None:
        raise RunError(f"{option} {folder}: the manifest lists no {name}; the checkpoint was saved from another "
                       "model or layout")
    try:
        data = (folder / name).read_bytes()
    except OSError as e:
        raise RunError(f"{option} {folder}: cannot read {name}: {e.strerror}") from None
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise RunError(f"{option} {folder}: {name} is corrupt ({len(data)} bytes, SHA-256 differs from the "
                       "manifest's); resume from an older checkpoint")
    return data


@dataclass(frozen=True, kw_only=True)
class Found:
    """The checkpoint a resume will load."""

    folder: Path
    manifest: dict
    skipped: tuple[str, ...] = field(default=())  #: newer step folders passed over, each with the reason


def find(path: str, option: str = "--resume") -> Found:
    """The complete checkpoint at ``path``: a step folder itself, or the newest complete one under a --save
    folder. ``RunError`` naming the problem when there is none."""
    root = Path(path)
    if not root.is_dir():
        raise RunError(f"{option} {path}: no such directory" if not root.exists() else
                       f"{option} {path}: not a directory")
    if (root / MANIFEST).exists() or _STEP_DIR.fullmatch(root.name):
        problem = incomplete(root)
        if problem:
            raise RunError(f"{option} {path}: {problem}; refusing to load it"
                           + _hint_older(root.parent, root.name))
        return Found(folder=root, manifest=_manifest(root))
    steps = sorted((d for d in root.iterdir() if d.is_dir() and _STEP_DIR.fullmatch(d.name)), reverse=True)
    skipped = []
    for d in steps:
        problem = incomplete(d)
        if not problem:
            return Found(folder=d, manifest=_manifest(d), skipped=tuple(skipped))
        skipped.append(problem)
    if skipped:
        raise RunError(f"{option} {path}: no complete checkpoint ({'; '.join(skipped)})")
    raise RunError(f"{option} {path}: no checkpoint there (expected step-NNNNNNNN folders written by --save)")


def incomplete(folder: Path) -> str:
    """Why ``folder`` is not a loadable checkpoint ('' when its manifest and every file's size check out)."""
    try:
        manifest = _manifest(folder)
    except FileNotFoundError:
        return f"{folder.name} has no {MANIFEST} (its save did not finish)"
    except (OSError, ValueError) as e:
        return f"{folder.name}/{MANIFEST} is unreadable ({e})"
    if manifest.get("format") != FORMAT:
        return f"{folder.name}/{MANIFEST} is not a {FORMAT} manifest"
    for name, entry in sorted(manifest["files"].items()):
        try:
            size = (folder / name).stat().st_size
        except OSError:
            return f"{folder.name}/{name} is missing"
        if size != entry["bytes"]:
            return f"{folder.name}/{name} has {size} bytes, the manifest says {entry['bytes']}"
    return ""


def check_save_dir(path: str) -> None:
    """Create ``--save`` DIR if needed and prove it writable (``RunError`` otherwise), before any step runs."""
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise RunError(f"--save {path}: exists and is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunError(f"--save {path}: cannot write there ({e.strerror or e})") from None


def preflight(cfg, optimizer: str | None = None, layers: int | None = None) -> Found | None:
    """Checks of --save, --save-every and --resume that need no torch; the checkpoint a resume will load.

    ``optimizer`` (a torch.optim class name) and ``layers`` (the model's) must be the checkpoint's.
    """
    if cfg.save_every is not None and cfg.save is None:
        raise RunError(f"--save-every {cfg.save_every} needs --save DIR")
    if cfg.save is not None:
        check_save_dir(cfg.save)
    if cfg.resume is None:
        return None
    found = find(cfg.resume)
    m, step = found.manifest, found.manifest["step"]
    if layers is not None and m["layers"] != layers:
        raise RunError(f"--resume {found.folder}: saved from a model of {m['layers']} layers; this one has {layers} "
                       "(give the model options of the run that saved it)")
    if optimizer is not None and m["optimizer"] != optimizer:
        raise RunError(f"--resume {found.folder}: it holds {m['optimizer']} state; --optimizer is {optimizer} "
                       f"(give --optimizer {m['optimizer'].lower()})")
    if step >= cfg.steps:
        raise RunError(f"--resume {found.folder}: the checkpoint is at step {step} and --steps is {cfg.steps} "
                       f"(the total, counted from the start), so nothing is left to run; give --steps > {step}")
    return found


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def _hint_older(root: Path, name: str) -> str:
    older = [d.name for d in sorted(root.glob("step-*"), reverse=True)
             if d.name < name and _STEP_DIR.fullmatch(d.name) and not incomplete(d)]
    return f" (the newest complete one is {root / older[0]}; or resume from {root})" if older else ""
