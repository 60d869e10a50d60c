"""The sizes stagewise accepts, checked before anything is allocated, and how to raise them.

A 13-byte CSV or a ``-m 1000000000`` must not exhaust memory: every size that
comes from a user (the CLI, a torch CSV, a profile, the workshop) is checked
against one of these limits first. Each limit has a default chosen so that the
largest documented case (zb-v at p=64, m=1024: 393,216 actions) fits with room
to spare, and an environment variable that raises it::

    STAGEWISE_MAX_ACTIONS=8000000 stagewise simulate zb-v -p 128 -m 4096

Example:
    >>> RANKS.check(8, "--ranks")      # fine: returns None
    >>> try:
    ...     RANKS.check(10**9, "--ranks")
    ... except LimitError as e:
    ...     print(e)
    --ranks 1000000000: over the limit of 4096 ranks; set STAGEWISE_MAX_RANKS=N to raise it
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from .errors import StagewiseError


class LimitError(StagewiseError):
    """A size over its limit; the message names the option, the limit and how to raise it."""


@dataclass(frozen=True, kw_only=True)
class Limit:
    """One documented limit: a default, raised by an environment variable."""

    env: str  #: STAGEWISE_MAX_...: set it to a larger whole number to raise the limit
    default: int
    what: str  #: what is counted, plural ("ranks", "actions per schedule")

    @property
    def value(self) -> int:
        """The limit in force (read at each check, so the variable can change at run time)."""
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        digits = raw.strip()
        # ASCII digits only: str.isdigit accepts '²', which int() refuses
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 18 or int(digits) < 1:
            raise LimitError(f"{self.env}={raw!r}: expected a whole number >= 1 (at most 18 digits)")
        return int(digits)

    def check(self, value: int, option: str, *, detail: str = "") -> None:
        """Raise ``LimitError`` if ``value`` is over the limit (``detail``: how the value arose)."""
        limit = self.value
        if value > limit:
            shown = detail or f"{option} {value}"
            raise LimitError(f"{shown}: over the limit of {limit} {self.what}; set {self.env}=N to raise it")


RANKS = Limit(env="STAGEWISE_MAX_RANKS", default=4096, what="ranks")
MICROBATCHES = Limit(env="STAGEWISE_MAX_MICROBATCHES", default=65536, what="micro-batches")
CHUNKS = Limit(env="STAGEWISE_MAX_CHUNKS", default=64, what="chunks per rank")
#: one schedule's actions: about 200 bytes each to generate and simulate, 2x that to draw
ACTIONS = Limit(env="STAGEWISE_MAX_ACTIONS", default=2_000_000, what="actions per schedule")
#: `compare` and `report` keep every family's timeline: all of them together
COMPARE_ACTIONS = Limit(env="STAGEWISE_MAX_COMPARE_ACTIONS", default=4_000_000,
                        what="actions of the schedules compared together")
#: `plan` keeps one schedule per (family, p, m, v) it searches: all of them together
PLAN_ACTIONS = Limit(env="STAGEWISE_MAX_PLAN_ACTIONS", default=4_000_000,
                     what="actions of the schedules a plan searches")
#: `auto` searches many greedy orders (and memory grows with m): p=8, m=2000 takes about 20 s and 150 MB
AUTO_ACTIONS = Limit(env="STAGEWISE_MAX_AUTO_ACTIONS", default=30_000, what="actions for `auto`")
#: the workshop page redraws on every change: all schedules of one view together (11 families at p=16,
#: m=64 make 41,443)
WORKSHOP_ACTIONS = Limit(env="STAGEWISE_MAX_WORKSHOP_ACTIONS", default=48_000, what="actions on the workshop page")
LAYERS = Limit(env="STAGEWISE_MAX_LAYERS", default=100_000, what="layers")
#: the built-in GPT (train, profile): one tensor, and all parameters (2**29 fp32 = 2 GiB)
ELEMENTS = Limit(env="STAGEWISE_MAX_ELEMENTS", default=2**28, what="elements in one tensor")
PARAMETERS = Limit(env="STAGEWISE_MAX_PARAMETERS", default=2**29, what="model parameters")
#: a torch CSV of zb-v at p=64, m=1024 is 2.8 MB; the largest CSV of the ACTIONS limit about 20 MB
FILE_BYTES = Limit(env="STAGEWISE_MAX_FILE_BYTES", default=64 * 2**20, what="bytes per input file")
#: every limit, for the docs and ``table()``
ALL = {"ranks": RANKS, "microbatches": MICROBATCHES, "chunks": CHUNKS, "actions": ACTIONS,
       "compare_actions": COMPARE_ACTIONS, "plan_actions": PLAN_ACTIONS, "auto_actions": AUTO_ACTIONS,
       "workshop_actions": WORKSHOP_ACTIONS, "layers": LAYERS, "elements": ELEMENTS, "parameters": PARAMETERS,
       "file_bytes": FILE_BYTES}


def check_schedule_size(ranks: int, microbatches: int, chunks: int, kinds: int, *, name: str = "",
                        actions: Limit = ACTIONS) -> None:
    """Check -p, -m, -v and the actions they make (at most ranks x chunks x microbatches x kinds)."""
    RANKS.check(ranks, "--ranks")
    MICROBATCHES.check(microbatches, "--microbatches")
    CHUNKS.check(chunks, "--chunks")
    total = ranks * chunks * microbatches * kinds
    who = f" ({name})" if name else ""
    actions.check(total, "", detail=f"-p {ranks} -m {microbatches} -v {chunks}{who} make up to {total} actions")


def check_gpt_size(*, layers: int, d_model: int, heads: int, seq: int, vocab: int, batch: int) -> None:
    """The built-in GPT's sizes (``batch``: sequences in one micro-batch), before a tensor is made."""
    LAYERS.check(layers, "--layers")
    tensors = (
        ("--d-model x 4 --d-model (one block's MLP weight)", 4 * d_model * d_model),
        ("--vocab x --d-model (the embedding)", vocab * d_model),
        ("sequences x --seq x 4 --d-model (a block's MLP activation)", batch * seq * 4 * d_model),
        ("sequences x --heads x --seq^2 (attention scores)", batch * heads * seq * seq),
        ("sequences x --seq x --vocab (the logits)", batch * seq * vocab),
    )
    for what, n in tensors:
        ELEMENTS.check(n, "", detail=f"{what} = {n}")
    params = layers * 12 * d_model * d_model + (vocab + seq) * d_model
    PARAMETERS.check(params, "", detail=f"--layers {layers} --d-model {d_model} --vocab {vocab} make about "
                     f"{params} parameters")


def read_text(path: str | Path, option: str) -> str:
    """The UTF-8 text of a regular file no larger than ``FILE_BYTES``.

    Refuses a FIFO, a device (``/dev/zero``) or a folder before reading, reads
    at most one byte over the cap, and names ``option`` and the path in every
    message (``OSError`` and decoding errors become ``LimitError``).
    """
    path = Path(path)
    try:
        with open(path, "rb", opener=_open_nonblocking) as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise LimitError(f"{option} {path}: not a regular file ({_kind(st.st_mode)})")
            cap = FILE_BYTES.value
            data = fh.read(cap + 1)
    except IsADirectoryError:
        raise LimitError(f"{option} {path}: not a regular file (a folder)") from None
    except OSError as e:
        raise LimitError(f"{option} {path}: cannot read: {e.strerror or e}") from None
    if len(data) > cap:
        FILE_BYTES.check(len(data), option, detail=f"{option} {path}: more than {cap} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LimitError(f"{option} {path}: not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})") from None


def _open_nonblocking(path, flags):
    # O_NONBLOCK: opening a FIFO with no writer must not hang; it is then refused as not a regular file
    return os.open(path, flags | os.O_NONBLOCK)


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return word
    return "not a file"


def table() -> str:
    """The limits in force, one per line (for docs and `--help` epilogues)."""
    return "\n".join(f"{lim.env:<28} {lim.value:>12}  {lim.what}" for lim in ALL.values())
