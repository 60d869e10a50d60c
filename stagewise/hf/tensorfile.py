"""A safetensors file's header, read and checked before any tensor is (no torch here).

The format: 8 bytes giving the header's length ``n`` (little-endian), ``n``
bytes of JSON mapping each tensor's name to its ``dtype``, ``shape`` and
``data_offsets`` [begin, end) into the data that follows, which the tensors
cover exactly. A truncated, empty or random file fails one of these rules
here, by name, instead of inside the reader; the file is opened only if it is
a regular file and at most the header (capped as safetensors caps it) is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import limits
from .errors import HFError
from .files import parse_json

#: bytes per element of each dtype safetensors writes
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
            "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
#: the dtypes a model's weights may have (converted to the run's dtype); FP8 needs its scales, integers are
#: quantized or not weights at all
FLOATS = ("F64", "F32", "F16", "BF16")
#: safetensors refuses a longer header (its own rule, against a header that claims gigabytes)
HEADER_BYTES = 100_000_000


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """One tensor as a header describes it."""

    file: Path  #: the safetensors file holding it
    dtype: str  #: safetensors' name: "F32", "BF16", ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def read_header(path: Path, shown: str) -> dict[str, TensorInfo]:
    """Every tensor of the safetensors file ``path`` (``shown`` names it in messages), the header checked."""
    try:
        with limits.open_regular(path, shown) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 8:
                raise HFError(f"{shown}: {size} bytes, too short for a safetensors file (an 8-byte header length, "
                              "the header, the data): empty or truncated")
            n = int.from_bytes(fh.read(8), "little")
            if n > min(HEADER_BYTES, size - 8):
                raise HFError(f"{shown}: not a safetensors file: its first 8 bytes give a header of {n} bytes, but "
                              f"the file has {size} bytes{' (at most 100 MB)' if n > HEADER_BYTES else ''}; "
                              "truncated or not safetensors")
            raw = fh.read(n)
    except limits.LimitError as e:
        raise HFError(str(e)) from None
    except OSError as e:
        raise HFError(f"{shown}: cannot read: {e.strerror or e}") from None
    header = parse_json(raw, f"{shown}: its safetensors header")
    if not isinstance(header, dict):
        raise HFError(f"{shown}: not a safetensors file: its header is not a JSON object")
    header.pop("__metadata__", None)
    return _tensors(header, path, shown, size - 8 - n)


def _tensors(header: dict, path: Path, shown: str, data: int) -> dict[str, TensorInfo]:
    out, spans = {}, []
    for name, entry in header.items():
        info, span = _entry(name, entry, path, shown)
        out[name] = info
        spans.append((span, name))
    end = 0
    for (begin, stop), name in sorted(spans):
        if begin != end:
            raise HFError(f"{shown}: tensor {name} starts at byte {begin} of the data, expected {end}: the tensors "
                          "overlap or leave a gap; not a valid safetensors file")
        end = stop
    if end != data:
        raise HFError(f"{shown}: the header's tensors take {end} bytes, the file holds {data} after the header: "
                      f"{'truncated' if end > data else 'trailing bytes'}; not a valid safetensors file")
    return out


def _entry(name: str, entry, path: Path, shown: str) -> tuple[TensorInfo, tuple[int, int]]:
    where = f"{shown}: tensor {name}"
    if not isinstance(entry, dict):
        raise HFError(f"{where}: its header entry is not an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise HFError(f"{where}: dtype {dtype!r:.40} is not a safetensors dtype ({', '.join(ITEMSIZE)})")
    if not (isinstance(shape, list) and all(_whole(s) for s in shape)):
        raise HFError(f"{where}: shape {shape!r:.60} is not a list of whole numbers >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise HFError(f"{where}: data_offsets {offsets!r:.60} is not [begin, end] with 0 <= begin <= end")
    info = TensorInfo(file=path, dtype=dtype, shape=tuple(shape))
    if offsets[1] - offsets[0] != info.numel * ITEMSIZE[dtype]:
        raise HFError(f"{where}: {offsets[1] - offsets[0]} bytes for shape {list(shape)} of {dtype} "
                      f"({info.numel * ITEMSIZE[dtype]} bytes); not a valid safetensors file")
    return info, (offsets[0], offsets[1])


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
