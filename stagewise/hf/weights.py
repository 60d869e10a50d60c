"""Per-rank weights: read single tensors of a local HF folder, write a rank's shard, index the shards.

A rank reads only the tensors of its own layers: ``Checkpoint`` maps each name
to its file (``model.safetensors.index.json``, or the keys of one
``model.safetensors``) and reads tensors one by one with safetensors'
``safe_open``, so the rest of the checkpoint is never loaded. It counts what it
read. Before that, every file it would open is checked: the index's names stay
inside the folder (``files.inside``), and each safetensors file is a regular
file whose header holds up (``tensorfile.read_header``), so a bad folder is
refused by name in the launching process, not as a reader's traceback on a rank.
Saving is the reverse: each rank writes ``model-0000k-of-0000n.safetensors``
with the tensors it owns, and one rank then writes the index from the shards'
headers and the config, the folder layout ``from_pretrained`` loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

import torch

from .errors import HFError
from .files import inside, read_json
from .tensorfile import FLOATS, ITEMSIZE, TensorInfo, read_header

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class Checkpoint:
    """The tensors of one HF folder, read lazily. Mutable: ``read`` records what it read (names, bytes)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.tensors = _tensors(self.folder)  # tensor name -> where it is, its dtype and shape
        self.read_names: list[str] = []
        self.read_bytes = 0

    def resolve(self, name: str, base: str) -> str:
        """The stored name of ``name``: as is, or without the ``base.`` prefix (GPT-2's original files)."""
        if name in self.tensors:
            return name
        bare = name.removeprefix(base + ".")
        if bare in self.tensors:
            return bare
        raise HFError(f"{self.folder}: tensor {name} is missing from the checkpoint "
                      f"({len(self.tensors)} tensors, e.g. {next(iter(self.tensors))})")

    def check(self, stored: str, shape: tuple[int, ...], name: str) -> None:
        """Tensor ``stored`` (HF name ``name``) has the ``shape`` the config makes and a floating dtype."""
        info = self.tensors[stored]
        if info.shape != tuple(shape):
            raise HFError(f"{info.file}: tensor {name} has shape {info.shape}; the config makes {tuple(shape)}")
        if info.dtype not in FLOATS:
            raise HFError(f"{info.file}: tensor {name} is {info.dtype}; weights must be {', '.join(FLOATS)} "
                          "(quantized checkpoints are not read)")

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """The named tensors (stored names), each file opened once, only these tensors read."""
        from safetensors import SafetensorError, safe_open

        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.tensors[name].file, []).append(name)
        out = {}
        for file, wanted in by_file.items():
            try:
                with safe_open(file, framework="pt") as f:
                    for name in wanted:
                        out[name] = f.get_tensor(name)
                        self.read_names.append(name)
                        self.read_bytes += out[name].numel() * out[name].element_size()
            except (SafetensorError, OSError) as e:  # e.g. the file changed since its header was checked
                raise HFError(f"{file}: cannot read tensor {name}: {str(e).splitlines()[0]}") from None
        return out


def _tensors(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of the folder, from the index (or the one file) and each file's checked header."""
    if not folder.is_dir():
        raise HFError(f"`source` {folder}: not a folder (give a model folder, or a config.json for random weights)")
    if (folder / INDEX).is_symlink() or (folder / INDEX).exists():
        return _indexed(folder, _weight_map(folder))
    if (folder / SINGLE).is_symlink() or (folder / SINGLE).exists():
        return read_header(inside(folder, SINGLE, str(folder)), str(folder / SINGLE))
    other = sorted(p.name for p in folder.glob("*.bin")) or sorted(p.name for p in folder.glob("*.pt*"))
    hint = f" (found {', '.join(other[:3])}: convert to safetensors with save_pretrained)" if other else ""
    raise HFError(f"`source` {folder}: no {SINGLE} or {INDEX}{hint}; give a folder with safetensors weights, "
                  "or its config.json to start from random weights")


def _weight_map(folder: Path) -> dict[str, str]:
    """The index's tensor name -> file name, each entry a string (the files are checked by ``_indexed``)."""
    where = str(folder / INDEX)
    index = read_json(inside(folder, INDEX, str(folder)))
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        got = "no weight_map" if not isinstance(index, dict) or "weight_map" not in index else \
            f"a weight_map that is {'empty' if weight_map == {} else type(weight_map).__name__}"
        raise HFError(f"{where}: {got}; an index maps each tensor name to its file "
                      '({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors", ...}})')
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise HFError(f"{where}: weight_map[{name!r:.60}] is {type(file).__name__}, not a file name")
    return weight_map


def _indexed(folder: Path, weight_map: dict[str, str]) -> dict[str, TensorInfo]:
    where = str(folder / INDEX)
    headers: dict[str, dict[str, TensorInfo]] = {}
    out = {}
    for name, file in weight_map.items():
        if file not in headers:
            path = inside(folder, file, f"{where} (for {name:.80})")
            headers[file] = read_header(path, str(path))
        if name not in headers[file]:
            raise HFError(f"{where} puts tensor {name:.80} in {file}, which has no such tensor")
        out[name] = headers[file][name]
    return out


def shard_name(k: int, n: int) -> str:
    """HF's shard file name: ``model-00001-of-00004.safetensors`` for k = 0, n = 4."""
    return f"model-{k + 1:05d}-of-{n:05d}.safetensors"


def save_shard(folder: str | Path, k: int, n: int, tensors: Mapping[str, torch.Tensor]) -> Path:
    """Write shard ``k`` of ``n`` with ``tensors`` (HF names) into ``folder``; returns its path."""
    from safetensors.torch import save_file

    path = Path(folder) / shard_name(k, n)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: t.detach().contiguous().cpu() for name, t in tensors.items()}, str(path),
              metadata={"format": "pt"})
    return path


def write_index(folder: str | Path, n: int, config) -> Path:
    """After every shard is written: the index (from the shards' headers) and ``config.json``.

    A rank that owns no tensor (DualPipe's second half holds copies only) wrote no shard.
    """
    folder = Path(folder)
    weight_map, total = {}, 0
    for k in range(n):
        path = folder / shard_name(k, n)
        if not path.is_file():
            continue  # a rank that owns no tensor writes no shard
        for name, info in read_header(path, str(path)).items():
            if name in weight_map:
                raise HFError(f"{name} is in {weight_map[name]} and {path.name}; each tensor is saved once")
            weight_map[name] = path.name
            total += info.numel * ITEMSIZE[info.dtype]
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    config.to_json_file(str(folder / "config.json"))
    return folder / INDEX
