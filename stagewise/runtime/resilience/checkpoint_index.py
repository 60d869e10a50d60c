"""DCP's index of a checkpoint (``.metadata``), read without running any code, and what a rank loads through it.

The index is a pickle, and a pickle is a program: ``pickle.load`` of a crafted one runs whatever it names
(DCP's own ``FileSystemReader.read_metadata`` does exactly that). A checkpoint folder may come from anywhere, so
``read`` unpickles it with ``IndexUnpickler``, which admits only the types a DCP index is made of (DCP's
metadata classes, ``torch.Size``, dtypes and layouts, paths) and refuses any other name before it is looked
up; then ``check_structure`` proves the result has the index's shape. ``Reader`` is DCP's ``FileSystemReader``
handed that checked index (it never unpickles), and ``Planner`` is DCP's default load planner that refuses to
unpickle a non-tensor entry (DCP reads those with ``torch.load(weights_only=False)``): a stagewise checkpoint
loads tensors only. ``problems`` compares the index with the state a rank is about to load (names, shapes,
dtypes, tensors where the model has tensors), so a checkpoint of another model is refused by name before DCP
reads a byte of it, and ``Reader`` names the data file that does not read as tensors.

Example::

    >>> import io, os, pickle
    >>> evil = pickle.dumps(os.system)  # what a crafted index would call
    >>> IndexUnpickler(io.BytesIO(evil)).load()
    Traceback (most recent call last):
    _pickle.UnpicklingError: posix.system is not a type of a DCP index
"""

from __future__ import annotations

import dataclasses
import io
import pickle

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.futures import Future
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)

from ... import limits

_META = "torch.distributed.checkpoint.metadata"
#: every global a DCP index may name: (module, name), matched exactly (a dotted name is never resolved)
ADMITTED = frozenset(
    {(_META, n) for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                          "TensorProperties", "StorageMeta", "MetadataIndex", "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
       ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
       ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict")}
    | {("torch", n) for n, v in vars(torch).items() if isinstance(v, torch.dtype)})


class BadIndex(ValueError):
    """The index is not a DCP checkpoint's index (the message says why, in a few words)."""


class IndexUnpickler(pickle.Unpickler):
    """An unpickler for DCP's index: a global outside ``ADMITTED`` stops it before it is looked up, so no
    function of the file's choosing is ever called (the C unpickler calls only what ``find_class`` returns)."""

    def find_class(self, module: str, name: str):
        if (module, name) not in ADMITTED:
            raise pickle.UnpicklingError(f"{module}.{name} is not a type of a DCP index")
        return super().find_class(module, name)


def read(path) -> Metadata:
    """The index at ``path``, unpickled with ``IndexUnpickler`` and checked (``BadIndex`` saying what is
    wrong: a refused global, a damaged pickle, the wrong shape)."""
    try:
        with limits.open_regular(path, "index") as f:
            md = IndexUnpickler(io.BytesIO(f.read())).load()
    except limits.LimitError as e:
        raise BadIndex(str(e).removeprefix(f"index {path}: ")) from None
    except pickle.UnpicklingError as e:
        raise BadIndex(str(e) if "DCP index" in str(e) else "not a pickle DCP wrote") from None
    except Exception as e:  # noqa: BLE001 - whatever a garbled pickle raises (a length past the machine's: Overflow)
        raise BadIndex(f"not a pickle DCP wrote ({type(e).__name__})") from None
    check_structure(md)
    return md


def check_structure(md) -> None:
    """``md`` has the shape of a DCP index: tensor or bytes entries, chunks within their tensors, storage
    entries naming a file, an offset and a length (``BadIndex`` otherwise)."""
    if type(md) is not Metadata:
        raise BadIndex(f"it holds a {type(md).__name__}, not DCP's Metadata")
    if not isinstance(md.state_dict_metadata, dict) or not isinstance(md.storage_data, dict):
        raise BadIndex("its entries are not DCP's (state_dict_metadata and storage_data are dicts)")
    for key, entry in md.state_dict_metadata.items():
        why = _entry_problem(entry) if isinstance(key, str) else "a key that is not a string"
        if why:
            raise BadIndex(f"entry {str(key)[:80]!r}: {why}")
    for index, info in md.storage_data.items():
        if not (type(index) is MetadataIndex and isinstance(index.fqn, str) and _size_or_none(index.offset)
                and type(info) is _StorageInfo and isinstance(info.relative_path, str) and _count(info.offset)
                and _count(info.length) and not getattr(info, "transform_descriptors", None)):
            raise BadIndex(f"storage entry {str(getattr(index, 'fqn', index))[:80]!r} is not a file, an offset "
                              "and a length")
    if not (md.planner_data is None or isinstance(md.planner_data, dict)):
        raise BadIndex("its planner data is not a dict")
    if not (md.storage_meta is None or type(md.storage_meta) is StorageMeta):
        raise BadIndex("its storage meta is not DCP's StorageMeta")


def _entry_problem(entry) -> str:
    if type(entry) is BytesStorageMetadata:
        return ""
    if type(entry) is not TensorStorageMetadata:
        return f"a {type(entry).__name__}, not a tensor's or bytes' metadata"
    if type(entry.properties) is not TensorProperties or not isinstance(entry.properties.dtype, torch.dtype):
        return "no dtype"
    size = entry.size
    if type(size) is not torch.Size or not isinstance(entry.chunks, list):
        return "no size or chunks"
    for chunk in entry.chunks:
        if not (type(chunk) is ChunkStorageMetadata and type(chunk.offsets) is torch.Size
                and type(chunk.sizes) is torch.Size and len(chunk.offsets) == len(chunk.sizes) == len(size)
                and all(0 <= o and o + s <= n for o, s, n in zip(chunk.offsets, chunk.sizes, size))):
            return f"a chunk outside its tensor of size {tuple(size)}"
    return ""


def _count(v) -> bool:
    return type(v) is int and v >= 0


def _size_or_none(v) -> bool:
    return v is None or type(v) is torch.Size


def problems(md: Metadata, state: dict, what) -> list[str]:
    """What keeps ``state`` (DCP's nested form, ``{"model": {...}, "optim": {...}}``) from loading out of the
    index ``md``: each key the index lacks, holds as bytes, or holds with another shape or dtype. ``what(top,
    key)`` words a key for the message ("parameter model.norm.weight", "optimizer state exp_avg of ...")."""
    out = []
    for top, part in state.items():
        for key, value in part.items():
            entry = md.state_dict_metadata.get(f"{top}.{key}")
            if not isinstance(value, torch.Tensor):
                continue
            if entry is None:
                out.append(f"it holds no {what(top, key)}")
            elif type(entry) is not TensorStorageMetadata:
                out.append(f"its {what(top, key)} is not a tensor")
            elif tuple(entry.size) != tuple(value.shape):
                out.append(f"its {what(top, key)} has shape {tuple(entry.size)}; this model's has "
                           f"{tuple(value.shape)}")
            elif entry.properties.dtype != value.dtype:
                out.append(f"its {what(top, key)} is {str(entry.properties.dtype).removeprefix('torch.')}; this "
                           f"model's is {str(value.dtype).removeprefix('torch.')}")
    return out


class Unreadable(Exception):
    """A data file of the checkpoint that did not read as the tensors the index says it holds."""

    def __init__(self, name: str, why: str):
        super().__init__(name, why)
        self.name, self.why = name, why


class Reader(FileSystemReader):
    """DCP's file reader with the index already read safely (``read``) and checked: it never unpickles it
    again, and a data file that does not read as tensors raises ``Unreadable`` naming it."""

    def __init__(self, folder, metadata: Metadata):
        super().__init__(str(folder))
        self._metadata = metadata

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if kwargs.get("rank") is not None:  # a rank-local index (stagewise writes none): never read
            raise FileNotFoundError("no rank-local index")
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def read_data(self, plan, planner) -> Future:
        """DCP's own read, one data file at a time, so that a failure names its file."""
        by_file: dict[str, list] = {}
        for item in plan.items:
            by_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in sorted(by_file.items()):
            try:
                super().read_data(dataclasses.replace(plan, items=items), planner).wait()
            except Exception as e:  # noqa: BLE001 - whatever the bytes made torch raise: not our tensors
                raise Unreadable(name, type(e).__name__) from None
        done: Future = Future()
        done.set_result(None)
        return done


class Planner(DefaultLoadPlanner):
    """DCP's default load planner, except that it never unpickles a non-tensor entry (``torch.load`` with
    ``weights_only=False``: code): ``problems`` has refused any such entry among the keys loaded."""

    def load_bytes(self, read_item, value) -> None:
        raise Unreadable(str(read_item.storage_index.fqn), "an entry of bytes where a tensor was expected")


def unreadable(exc: BaseException) -> Unreadable | None:
    """The ``Unreadable`` behind what ``dcp.load`` raised (itself, or one rank's inside a CheckpointException)."""
    if isinstance(exc, Unreadable):
        return exc
    for value in (getattr(exc, "failures", None) or {}).values():
        inner = value[0] if isinstance(value, tuple) else value
        if isinstance(inner, Unreadable):
            return inner
    return None
