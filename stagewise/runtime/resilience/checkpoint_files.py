"""A checkpoint folder on disk: a manifest written last, and finding the newest complete one.

``--save DIR`` writes ``DIR/step-00000004/`` after step 4: one torch.distributed.checkpoint (DCP) checkpoint
(``__R_K.distcp`` files written by each rank R, ``.metadata`` by rank 0; checkpoint.py), ``rng-rank-00001.pt``
per rank, and ``manifest.json`` last. The manifest is written to a temporary name in the same folder,
fsynced, then renamed over its final name (``os.replace`` is atomic), and the folder is fsynced; DCP fsyncs
its files. The manifest lists each file with its size and SHA-256, so a folder without a manifest is a save
that did not finish, and a file that differs from its entry is corrupt: neither ever loads. ``--resume DIR``
takes the newest complete step folder under DIR (saying which incomplete ones it skipped), or exactly the
step folder it is given. An earlier stagewise's layer-keyed folders (``layer-00003.pt`` per layer) still
load (checkpoint_layers.py).

Every manifest is checked against its schema before it is trusted
(``checkpoint_manifest``), and names the run it belongs to: ``--save`` into a
folder holding another run's checkpoints is refused unless ``--overwrite``
(which deletes them at the first save, only the files their manifests list; anything else in a step folder,
or a symlink, refuses it), and ``--resume`` refuses another
model's checkpoint saying what differs. Temporary files left by a crash are
deleted at the next save. A failed write (a full disk) names the file.

No torch here: the launcher runs these checks before any rank starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ... import limits
from . import checkpoint_manifest as manifests
from ..config import RunError

MANIFEST = "manifest.json"
EXPORT = "hf"  #: the model in its own library's format, beside the checkpoint (HF: a from_pretrained folder)
DCP_METADATA = ".metadata"  #: DCP's index of a checkpoint (rank 0 writes it)
_DCP_DATA = re.compile(r"__\d+_\d+\.distcp")  #: DCP's data files, per rank
_STEP_DIR = re.compile(r"step-(\d{8})")
#: atomic_write's temporaries, check_save_dir's probe, DCP's metadata before its rename
_TEMPORARY = re.compile(r"\..+\.tmp-\d+|\.probe-\d+|(__\d+)?\.metadata\.tmp")
#: the files of a checkpoint by name alone (a step folder whose save did not finish has no manifest to list them)
_OURS = re.compile(rf"{manifests.FILE_NAME.pattern}|{re.escape(MANIFEST)}")
#: what an export (HF save_pretrained) writes, by name, where no manifest lists it
_EXPORT_FILE = re.compile(r"config\.json|generation_config\.json|model(-\d{5}-of-\d{5})?\.safetensors"
                          r"|model\.safetensors\.index\.json")


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` steps."""
    return Path(root) / f"step-{step:08d}"


def layer_file(layer: int) -> str:
    return f"layer-{layer:05d}.pt"


def rng_file(rank: int) -> str:
    return f"rng-rank-{rank:05d}.pt"


def is_dcp_file(name: str) -> bool:
    """A file of a DCP checkpoint (its data files and its metadata)."""
    return name == DCP_METADATA or _DCP_DATA.fullmatch(name) is not None


def dcp_files(folder: Path, rank: int) -> list[str]:
    """The DCP files ``rank`` wrote into ``folder`` (its data files; rank 0's also the metadata)."""
    mine = sorted(p.name for p in folder.iterdir() if p.name.startswith(f"__{rank}_") and is_dcp_file(p.name))
    return mine + ([DCP_METADATA] if rank == 0 and (folder / DCP_METADATA).exists() else [])


def clear_step(folder: Path) -> None:
    """Delete an older save's checkpoint files from a step folder (its manifest went first): another layout
    writes other files, and none of the old ones may linger beside the new."""
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink() and (manifests.FILE_NAME.fullmatch(f.name) or
                                                   _TEMPORARY.fullmatch(f.name)):
            f.unlink(missing_ok=True)


def entry(path: Path) -> dict:
    """The manifest entry of a file on disk: its size and SHA-256 (read in blocks)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def check_file(folder: Path, name: str, manifest: dict, option: str = "`resume`") -> None:
    """``name`` matches its manifest entry (``RunError`` naming it when not), read in blocks."""
    if manifest["files"].get(name) is None:
        raise RunError(f"{option} {folder}: the manifest lists no {name}; the checkpoint was saved from another "
                       "model or layout")
    path = folder / name
    if path.is_symlink() or not path.is_file():
        raise RunError(f"{option} {folder}: {name} is not a regular file (a checkpoint's files are its own)")
    try:
        got = entry(path)
    except OSError as e:
        raise RunError(f"{option} {folder}: cannot read {name}: {e.strerror}") from None
    if got != manifest["files"][name]:
        raise RunError(f"{option} {folder}: {name} is corrupt ({got['bytes']} bytes, SHA-256 differs from the "
                       "manifest's); resume from an older checkpoint")


def atomic_write(path: Path, data: bytes) -> dict:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new one, never a part.

    Returns the manifest entry of the file: its size and SHA-256.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # a full disk, a quota, a vanished folder: name the file, leave no temporary behind
        try:
            tmp.unlink()
        except OSError:
            pass
        raise OSError(e.errno, f"cannot write checkpoint file {path}: {e.strerror or e}") from None
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


def read_verified(folder: Path, name: str, manifest: dict, option: str = "`resume`") -> bytes:
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


def find(path: str, option: str = "`resume`") -> Found:
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
    raise RunError(f"{option} {path}: no checkpoint there (expected step-NNNNNNNN folders written by `save`)")


def incomplete(folder: Path) -> str:
    """Why ``folder`` is not a loadable checkpoint ('' when its manifest and every file's size check out)."""
    try:
        manifest = _manifest(folder)
    except FileNotFoundError:
        return f"{folder.name} has no {MANIFEST} (its save did not finish)"
    except (OSError, ValueError, RecursionError) as e:
        return f"{folder.name}/{MANIFEST} is unreadable ({type(e).__name__}: {e})"
    why = manifests.problem(manifest, folder.name)
    if why:
        return f"{folder.name}/{MANIFEST} is malformed: {why}"
    for name, entry in sorted(manifest["files"].items()):
        try:
            size = (folder / name).stat().st_size
        except OSError:
            return f"{folder.name}/{name} is missing"
        if size != entry["bytes"]:
            return f"{folder.name}/{name} has {size} bytes, the manifest says {entry['bytes']}"
    return ""


def check_save_dir(path: str, overwrite: bool = False, steps=()) -> None:
    """Create `save` DIR if needed and prove it writable (``RunError`` otherwise), before any step runs.

    DIR holds checkpoints only: a file or folder of another kind (a corpus, a model's weights) is refused
    unless ``overwrite`` (then written beside, never removed); a symlink inside it is refused always (a save
    must not write through it to elsewhere), and so is anything but a folder where one of ``steps``' folders
    will go.
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise RunError(f"`save` {path}: exists and is not a directory")
    if _STEP_DIR.fullmatch(root.name) or (root / MANIFEST).exists():
        raise RunError(f"`save` {path}: is one checkpoint's step folder; give the folder that holds the "
                       f"step-NNNNNNNN folders ({root.parent})")
    entries = sorted(root.iterdir()) if root.is_dir() else []
    links = [e.name for e in entries if e.is_symlink()]
    if links:
        raise RunError(f"`save` {path}: {links[0]} is a symlink; a checkpoint folder holds its own files and "
                       "folders, never links to others (give another `save` folder)")
    foreign = [e.name for e in entries if not (e.is_dir() and _STEP_DIR.fullmatch(e.name))
               and not _TEMPORARY.fullmatch(e.name)]
    if foreign and not overwrite:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise RunError(f"`save` {path}: holds {foreign[0]}{more}, which is not a checkpoint; give an empty or new "
                       "folder (`overwrite` writes beside them and removes none of them)")
    for k in steps:
        d = step_dir(root, k)
        if d.exists() and not d.is_dir():
            raise RunError(f"`save` {path}: {d.name} is a file where step {k}'s checkpoint folder goes; move it "
                           "away or give another `save` folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise RunError(f"`save` {path}: cannot write there ({e.strerror or e})") from None


def preflight(cfg, optimizer: str | None = None, layers: int | None = None) -> Found | None:
    """Checks of --save, --save-every, --overwrite and --resume that need no torch; the checkpoint a resume
    will load.

    ``optimizer`` (a torch.optim class name) and ``layers`` (the model's) must be the checkpoint's, and so must
    the model, seed and data (``checkpoint_manifest.differences``).
    """
    if cfg.save_every is not None and cfg.save is None:
        raise RunError(f"`save_every` {cfg.save_every} needs `save` DIR")
    if getattr(cfg, "overwrite", False) and cfg.save is None:
        raise RunError("`overwrite` needs `save` DIR (it lets `save` replace another run's checkpoints)")
    found = None if cfg.resume is None else find(cfg.resume)
    if cfg.save is not None:
        first = found.manifest["step"] if found is not None else 0
        check_save_dir(cfg.save, getattr(cfg, "overwrite", False), saved_steps(cfg, first))
        run_id = found.manifest["run"]["id"] if found else None
        if getattr(cfg, "overwrite", False):
            check_overwrite(cfg.save, run_id)  # what it will delete is ours, or it refuses now, not after a step
        else:
            check_not_another_run(cfg.save, run_id)
    if found is None:
        return None
    m, step = found.manifest, found.manifest["step"]
    differ = manifests.differences(m["run"], cfg)
    if differ:
        raise RunError(f"`resume` {found.folder}: a checkpoint of another model or data ({'; '.join(differ)}); "
                       "give the options of the run that saved it")
    if layers is not None and m["layers"] != layers:
        raise RunError(f"`resume` {found.folder}: saved from a model of {m['layers']} layers; this one has {layers} "
                       "(give the model options of the run that saved it)")
    if optimizer is not None and m["optimizer"] != optimizer:
        raise RunError(f"`resume` {found.folder}: it holds {m['optimizer']} state; `optimizer` is {optimizer} "
                       f"(give `optimizer` {m['optimizer'].lower()})")
    if step >= cfg.steps:
        raise RunError(f"`resume` {found.folder}: the checkpoint is at step {step} and `steps` is {cfg.steps} "
                       f"(the total, counted from the start), so nothing is left to run; give `steps` > {step}")
    return found


def saved_steps(cfg, first: int = 0) -> list[int]:
    """The steps after which a run of ``cfg`` resumed after ``first`` steps saves: every `save_every` and the
    last (checked before the first step, so no run trains for hours to fail at its save)."""
    every = cfg.save_every or 0
    return [k for k in range(first + 1, cfg.steps + 1) if k == cfg.steps or (every and k % every == 0)]


def other_runs(root: str | os.PathLike, run_id: str | None) -> list[tuple[Path, dict]]:
    """The complete checkpoints under ``root`` that belong to another run than ``run_id`` (None: any run)."""
    out = []
    for d in _step_dirs(Path(root)):
        if not incomplete(d):
            m = _manifest(d)
            if m["run"]["id"] != run_id:
                out.append((d, m))
    return out


def check_not_another_run(path: str, run_id: str | None) -> None:
    """``RunError`` when --save ``path`` holds another run's checkpoints (a resume saves into its own run's)."""
    others = other_runs(path, run_id)
    if others:
        d, m = others[-1]
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise RunError(f"`save` {path}: holds checkpoints of another run ({d.name}{more}, run {m['run']['id'][:8]}, "
                       f"saved {m['saved_at']}); give `overwrite` to replace them, or another `save` folder")


def prepare_save(path: str, run_id: str, overwrite: bool) -> list[str]:
    """Before a run's first save (rank 0): refuse another run's checkpoints that appeared since the launch
    (a concurrent run), or with ``overwrite`` delete them and every incomplete step folder, file by file, only
    what a save of ours wrote (``check_overwrite``; anything else refuses); delete the temporary files a crashed
    save left. Returns what was deleted."""
    root = Path(path)
    if not overwrite:
        check_not_another_run(path, run_id)
    deleted = []
    if overwrite:
        for d, ours in check_overwrite(path, run_id):
            for f in ours:  # deepest first: a folder's files, then the folder, empty by then
                if f.is_dir():
                    f.rmdir()
                else:
                    f.unlink(missing_ok=True)
            d.rmdir()
            deleted.append(d.name)
    for d in [root, *_step_dirs(root)]:
        for f in d.iterdir():
            if _TEMPORARY.fullmatch(f.name) and f.is_file() and not f.is_symlink():
                f.unlink(missing_ok=True)
                deleted.append(f"{d.name}/{f.name}")
    if deleted:
        fsync_dir(root)
    return deleted


def check_overwrite(path: str, run_id: str | None) -> list[tuple[Path, list[Path]]]:
    """What ``overwrite`` deletes under `save` ``path``: each step folder of another run than ``run_id`` (None:
    any), or incomplete, with its files, deepest first. Only files a save of ours wrote go: those its manifest
    lists (the export folder's too), or, without a manifest, those of a checkpoint's names; anything else (a
    user's file, a link, a folder) refuses the whole save by name (``RunError``), before anything is deleted."""
    root = Path(path)
    plan, blocked = [], [f"{e.name} (a symlink)" for e in sorted(root.iterdir()) if e.is_symlink()] \
        if root.is_dir() else []
    for d in _step_dirs(root):
        manifest = None if incomplete(d) else _manifest(d)
        if manifest is None or manifest["run"]["id"] != run_id:
            plan.append((d, _ours(d, manifest, blocked)))
    if blocked:
        more = f" and {len(blocked) - 1} more" if len(blocked) > 1 else ""
        raise RunError(f"`save` {path}: {blocked[0]}{more} is not a file of a checkpoint; `overwrite` deletes only "
                       "what a checkpoint's manifest lists and refuses the rest (move it out of the folder, or give "
                       "another `save` folder)")
    return plan


def _ours(step: Path, manifest: dict | None, blocked: list[str]) -> list[Path]:
    """The files (and the export folder) in ``step`` that a save of ours wrote, deepest first; what else is
    there goes to ``blocked`` (a symlink always: a link is never ours, and what it points to is never read)."""
    def named(name: str) -> bool:
        return bool(_TEMPORARY.fullmatch(name) or (name in listed if listed is not None else _OURS.fullmatch(name)))

    listed = {*manifest["files"], MANIFEST} if manifest else None
    export = manifest.get("export") if manifest else None
    ours: list[Path] = []
    for e in sorted(step.iterdir()):
        if e.is_symlink():
            blocked.append(f"{step.name}/{e.name} (a symlink)")
        elif e.is_dir() and e.name == EXPORT:
            inner = sorted(e.iterdir())
            for f in inner:
                mine = (f.name in export and f.stat().st_size == export[f.name]["bytes"] if export is not None
                        else _EXPORT_FILE.fullmatch(f.name))
                if f.is_symlink() or not f.is_file() or not mine:
                    blocked.append(f"{step.name}/{e.name}/{f.name}")
            ours += [*inner, e]
        elif e.is_file() and named(e.name):
            ours.append(e)
        else:
            blocked.append(f"{step.name}/{e.name}")
    return ours


def export_listing(folder: Path) -> dict:
    """The manifest's ``export``: each file of the export folder by name and size (what ``overwrite`` may
    delete of it later)."""
    return {f.name: {"bytes": f.stat().st_size} for f in sorted(folder.iterdir())
            if f.is_file() and not f.is_symlink()} if folder.is_dir() else {}


def _step_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and _STEP_DIR.fullmatch(d.name))


def _manifest(folder: Path) -> dict:
    """The manifest of ``folder``: a regular file of ours (a symlink, FIFO or device is refused unread),
    within the file-size limit."""
    path = folder / MANIFEST
    if path.is_symlink():
        raise ValueError("a symlink (a checkpoint's files are its own, never links)")
    if not path.exists():
        raise FileNotFoundError(path)
    try:
        text = limits.read_text(path, "manifest")
    except limits.LimitError as e:
        raise ValueError(str(e).removeprefix(f"manifest {path}: ")) from None
    return json.loads(text)


def _hint_older(root: Path, name: str) -> str:
    older = [d.name for d in sorted(root.glob("step-*"), reverse=True)
             if d.name < name and _STEP_DIR.fullmatch(d.name) and not incomplete(d)]
    return f" (the newest complete one is {root / older[0]}; or resume from {root})" if older else ""
