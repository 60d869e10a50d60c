"""The files of a folder the user named (a model, a tokenizer): inside it, regular, bounded (no torch here).

A model folder's index names its weight files, and that text is not to be
trusted: a name must be relative, without ``..``, and resolve (symlinks
followed) inside the folder. A Hugging Face hub cache snapshot
(``models--org--name/snapshots/<revision>``) links every file to
``../../blobs/``; that repository's ``blobs`` folder counts as inside. Each
file must be a regular file: a FIFO would block a read forever and
``/dev/zero`` never ends, so both are refused before they are opened
(``stagewise.limits.open_regular``). JSON is read whole under ``FILE_BYTES``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from .. import limits
from .errors import HFError


def roots(folder: Path) -> tuple[Path, ...]:
    """Where the files of ``folder`` may really lie: the folder, and a hub cache snapshot's ``blobs``."""
    real = folder.resolve()
    repo = real.parent.parent
    if real.parent.name == "snapshots" and (repo / "blobs").is_dir():
        return real, (repo / "blobs").resolve()
    return (real,)


def inside(folder: Path, name: Any, where: str) -> Path:
    """``folder / name``, once it is known to be a regular file that really lies inside ``folder``.

    ``name`` comes from a file (an index's ``weight_map``); ``where`` says which, for the messages.

    >>> inside(Path("llama"), "../../etc/passwd", "llama/model.safetensors.index.json")  # doctest: +SKIP
    HFError: llama/model.safetensors.index.json names '../../etc/passwd': it climbs out of the folder with '..'; ...
    """
    rule = "each file it names must be a relative path inside the folder"
    if not isinstance(name, str) or not name or "\x00" in name:
        raise HFError(f"{where} names {shown(name)} as a file: not a file name; {rule}")
    pure = PurePosixPath(name)
    if pure.is_absolute():
        raise HFError(f"{where} names {shown(name)}: an absolute path; {rule}")
    if ".." in pure.parts:
        raise HFError(f"{where} names {shown(name)}: it climbs out of the folder with '..'; {rule}")
    path = folder / name
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        if path.is_symlink():
            raise HFError(f"{path} is a symlink to {shown(os.readlink(path))}, which does not exist") from None
        raise HFError(f"{where} names {shown(name)}, which is not in {folder}") from None
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise HFError(f"{path}: cannot follow its links ({getattr(e, 'strerror', None) or e})") from None
    if not any(real.is_relative_to(root) for root in roots(folder)):
        raise HFError(f"{path} is a symlink to {real}, outside {folder}; only files inside the folder named are "
                      "read (copy the file in)")
    regular(path)
    return path


def regular(path: Path) -> None:
    """Refuse what is not a regular file (a FIFO, a device, a folder) without reading from it."""
    try:
        with limits.open_regular(path, ""):
            pass
    except limits.LimitError as e:
        raise HFError(str(e).lstrip()) from None


def read_json(path: Path, option: str = "") -> Any:
    """A JSON file's value: regular, at most ``FILE_BYTES``, UTF-8, not nested without bound.

    Messages start with ``option`` (the argument that named the file, if it did) and the path.
    """
    try:
        text = limits.read_text(path, option)
    except limits.LimitError as e:
        raise HFError(str(e).lstrip()) from None
    return parse_json(text, f"{option} {path}".lstrip())


def parse_json(text: str | bytes, shown: str) -> Any:
    """JSON text, with each way it can be refused named (``shown`` starts the message)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise HFError(f"{shown}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise HFError(f"{shown}: not JSON this reader accepts: nested too deeply") from None
    except UnicodeDecodeError as e:
        raise HFError(f"{shown}: not UTF-8 text (byte {e.start})") from None
    except ValueError:  # int() refuses more than 4,300 digits
        raise HFError(f"{shown}: not JSON this reader accepts: a number of more than "
                      f"{sys.get_int_max_str_digits()} digits") from None


def shown(value: Any) -> str:
    """A value from a file, quoted and cut short (a name can be megabytes long)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def one_line(e: BaseException) -> str:
    """A library's exception as one short line (for a message that quotes why it refused)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."
