"""Per-rank weights: read single tensors of a local HF folder, write a rank's shard, index the shards.

A rank reads only the tensors of its own layers: ``Checkpoint`` maps each name
to its file (``model.safetensors.index.json``, or the keys of one
``model.safetensors``) and reads tensors one by one with safetensors'
``safe_open``, so the rest of the checkpoint is never loaded. It counts what it
read. Saving is the reverse: each rank writes ``model-0000k-of-0000n.safetensors``
with the tensors it owns, and one rank then writes the index from the shards'
headers and the config, the folder layout ``from_pretrained`` loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

import torch

from .errors import HFError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class Checkpoint:
    """The tensors of one HF folder, read lazily. Mutable: ``read`` records what it read (names, bytes)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.files = _weight_map(self.folder)  # tensor name -> file name
        self.read_names: list[str] = []
        self.read_bytes = 0

    def resolve(self, name: str, base: str) -> str:
        """The stored name of ``name``: as is, or without the ``base.`` prefix (GPT-2's original files)."""
        if name in self.files:
            return name
        bare = name.removeprefix(base + ".")
        if bare in self.files:
            return bare
        raise HFError(f"{self.folder}: tensor {name} is missing from the checkpoint "
                      f"({len(self.files)} tensors, e.g. {next(iter(self.files))})")

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """The named tensors (stored names), each file opened once, only these tensors read."""
        from safetensors import safe_open

        by_file: dict[str, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        out = {}
        for file, wanted in by_file.items():
            with safe_open(self.folder / file, framework="pt") as f:
                for name in wanted:
                    out[name] = f.get_tensor(name)
                    self.read_names.append(name)
                    self.read_bytes += out[name].numel() * out[name].element_size()
        return out


def _weight_map(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        raise HFError(f"--hf {folder}: not a folder (give a model folder, or a config.json for random weights)")
    if (folder / INDEX).is_file():
        return dict(json.loads((folder / INDEX).read_text())["weight_map"])
    if (folder / SINGLE).is_file():
        from safetensors import safe_open

        with safe_open(folder / SINGLE, framework="pt") as f:
            return {name: SINGLE for name in f.keys()}
    other = sorted(p.name for p in folder.glob("*.bin")) or sorted(p.name for p in folder.glob("*.pt*"))
    hint = f" (found {', '.join(other[:3])}: convert to safetensors with save_pretrained)" if other else ""
    raise HFError(f"--hf {folder}: no {SINGLE} or {INDEX}{hint}; give a folder with safetensors weights, "
                  "or its config.json to start from random weights")


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
    from safetensors import safe_open

    folder = Path(folder)
    weight_map, total = {}, 0
    for k in range(n):
        if not (folder / shard_name(k, n)).is_file():
            continue  # a rank that owns no tensor writes no shard
        with safe_open(folder / shard_name(k, n), framework="pt") as f:
            for name in f.keys():
                if name in weight_map:
                    raise HFError(f"{name} is in {weight_map[name]} and {shard_name(k, n)}; each tensor is saved once")
                weight_map[name] = shard_name(k, n)
                sl = f.get_slice(name)
                total += _numel(sl.get_shape()) * _itemsize(sl.get_dtype())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    config.to_json_file(str(folder / "config.json"))
    return folder / INDEX


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _itemsize(dtype: str) -> int:
    return _ITEMSIZE.get(dtype, 4)
