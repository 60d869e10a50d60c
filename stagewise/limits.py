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
    --ranks 1000000000: over the limit of 4,096 ranks; set STAGEWISE_MAX_RANKS=N to raise it
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import StagewiseError

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (a tenth of `stagewise simulate`'s start-up)
if TYPE_CHECKING:  # pathlib (and the urllib it imports) is a tenth of `stagewise simulate`'s start-up too
    from pathlib import Path
    from typing import BinaryIO


class LimitError(StagewiseError):
    """A size over its limit; the message names the option, the limit and how to raise it."""


@dataclass(frozen=True, kw_only=True)
class Limit:
    """One documented limit: a default, raised by an environment variable."""

    env: str  #: STAGEWISE_MAX_...: set it to a larger whole number to raise the limit
    default: int
    what: str  #: what is counted, plural ("ranks", "actions per schedule")
    where: str = ""  #: where users meet it (docs/limits.md's table)

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

    def check(self, value: int | float, option: str, *, detail: str = "") -> None:
        """Raise ``LimitError`` if ``value`` is over the limit (``detail``: how the value arose)."""
        limit = self.value
        if value > limit:
            shown = detail or f"{option} {value}"
            raise LimitError(f"{shown}: over the limit of {limit:,} {self.what}; set {self.env}=N to raise it")


RANKS = Limit(env="STAGEWISE_MAX_RANKS", default=4096, what="ranks", where="-p of every command, plan's -N, rows of a CSV")
MICROBATCHES = Limit(env="STAGEWISE_MAX_MICROBATCHES", default=65536, what="micro-batches",
                     where="-m, a CSV's indices, a profile's sizes")
CHUNKS = Limit(env="STAGEWISE_MAX_CHUNKS", default=64, what="chunks per rank", where="-v")
#: one schedule's actions: about 200 bytes each to generate and simulate, 2x that to draw
ACTIONS = Limit(env="STAGEWISE_MAX_ACTIONS", default=2_000_000, what="actions per schedule",
                where="p x v x m x kinds; zb-v at p=64, m=1024 has 393,216")
#: `compare` and `report` keep every family's timeline: all of them together
COMPARE_ACTIONS = Limit(env="STAGEWISE_MAX_COMPARE_ACTIONS", default=4_000_000,
                        what="actions of the schedules compared together", where="`compare`, `report`")
#: `plan` keeps one schedule per (family, p, m, v) it searches: all of them together
PLAN_ACTIONS = Limit(env="STAGEWISE_MAX_PLAN_ACTIONS", default=4_000_000,
                     what="actions of the schedules a plan searches", where="an upper bound, checked first")
#: `auto` searches many greedy orders (and memory grows with m): p=8, m=2000 takes about 20 s and 150 MB
AUTO_ACTIONS = Limit(env="STAGEWISE_MAX_AUTO_ACTIONS", default=30_000, what="actions for `auto`",
                     where="p=8, m=2000 takes about 20 s")
#: the workshop page redraws on every change: all schedules of one view together (13 families at p=16,
#: m=64 make 48,688)
WORKSHOP_ACTIONS = Limit(env="STAGEWISE_MAX_WORKSHOP_ACTIONS", default=56_000, what="actions on the workshop page",
                         where="one workshop view, counted from p, m, v and slices before any schedule is made "
                         "(13 families at p=16, m=64 make up to 51,200; the page also caps p <= 64, m <= 256, v <= 8, slices <= 8)")
LAYERS = Limit(env="STAGEWISE_MAX_LAYERS", default=100_000, what="layers",
               where="a model (--layers, an HF config, Layers(count)), a profile, a plan's model file")
#: a cluster plan's GPUs (and a hardware file's GPUs per node): its layouts are the divisors of this count
GPUS = Limit(env="STAGEWISE_MAX_GPUS", default=131_072, what="GPUs",
             where="a cluster plan's --gpus and a hardware file's gpus_per_node")
#: a plan's MoE model file: routed experts per block (expert-parallel degrees are their divisors; Kimi K2 has 384);
#: not in ``ALL`` until the README's limits table (generated from ``ALL``) is rewritten with it
EXPERTS = Limit(env="STAGEWISE_MAX_EXPERTS", default=65_536, what="routed experts per MoE block",
                where="a plan's model file (moe.experts)")
#: a model (train, profile): one tensor, and all parameters (2**31 fp32 = 8 GiB: a 1B model fits, 7B does not)
ELEMENTS = Limit(env="STAGEWISE_MAX_ELEMENTS", default=2**28, what="elements in one tensor",
                 where="the built-in GPT and HF configs in train and profile: weights, activations, logits")
PARAMETERS = Limit(env="STAGEWISE_MAX_PARAMETERS", default=2**31, what="model parameters",
                   where="the built-in GPT and HF configs, before anything is built (8 GiB in fp32; Llama-3.2-1B fits)")
#: a torch CSV of zb-v at p=64, m=1024 is 2.8 MB; the largest CSV of the ACTIONS limit about 20 MB
FILE_BYTES = Limit(env="STAGEWISE_MAX_FILE_BYTES", default=64 * 2**20, what="bytes per input file",
                   where="CSVs, profiles, model and hardware files, manifests, configs")
#: training runs (train, the API's launcher, profile)
LOCAL_RANKS = Limit(env="STAGEWISE_MAX_LOCAL_RANKS", default=256,
                    what="ranks started on one machine", where="train's p x dp, stagewise.launch (more: torchrun)")
BATCH = Limit(env="STAGEWISE_MAX_BATCH", default=1 << 20, what="sequences per step", where="--batch")
#: the step's batch is made whole on every rank (then split): its tokens are held at once
TOKENS = Limit(env="STAGEWISE_MAX_TOKENS", default=1 << 24, what="tokens per step", where="--batch x --seq")
TIMEOUT = Limit(env="STAGEWISE_MAX_TIMEOUT", default=86400, what="seconds a rank waits for a peer",
                where="--timeout, Pipeline(timeout=), launch(timeout=)")
THREADS = Limit(env="STAGEWISE_MAX_THREADS", default=4096, what="threads per rank", where="--threads")
#: a training text is read whole on every rank (8 bytes per token once tokenized)
DATA_BYTES = Limit(env="STAGEWISE_MAX_DATA_BYTES", default=256 * 2**20, what="bytes of training data",
                   where="--data, read whole on every rank")
#: profile: each size and repeat is a timed run of every layer
REPEATS = Limit(env="STAGEWISE_MAX_REPEATS", default=1000, what="timed repeats per layer", where="profile --repeats")
SIZES = Limit(env="STAGEWISE_MAX_SIZES", default=64, what="micro-batch sizes per profile",
              where="profile --micro-batch-sizes")
#: `draw` to the terminal builds each row of text in memory
TEXT_WIDTH = Limit(env="STAGEWISE_MAX_TEXT_WIDTH", default=10_000, what="columns of text", where="draw --width")
#: every limit, for the docs and ``table()``
ALL = {"ranks": RANKS, "microbatches": MICROBATCHES, "chunks": CHUNKS, "actions": ACTIONS,
       "compare_actions": COMPARE_ACTIONS, "plan_actions": PLAN_ACTIONS, "auto_actions": AUTO_ACTIONS,
       "workshop_actions": WORKSHOP_ACTIONS, "layers": LAYERS, "gpus": GPUS, "experts": EXPERTS, "elements": ELEMENTS, "parameters": PARAMETERS,
       "file_bytes": FILE_BYTES, "local_ranks": LOCAL_RANKS, "batch": BATCH, "tokens": TOKENS, "timeout": TIMEOUT,
       "threads": THREADS, "data_bytes": DATA_BYTES, "repeats": REPEATS, "sizes": SIZES, "text_width": TEXT_WIDTH}


def check_schedule_size(ranks: int, microbatches: int, chunks: int, kinds: int, *, name: str = "",
                        actions: Limit = ACTIONS) -> None:
    """Check -p, -m, -v and the actions they make (at most ranks x chunks x microbatches x kinds)."""
    RANKS.check(ranks, "`ranks`")
    MICROBATCHES.check(microbatches, "`microbatches`")
    CHUNKS.check(chunks, "`chunks`")
    total = ranks * chunks * microbatches * kinds
    who = f" ({name})" if name else ""
    actions.check(total, "", detail=f"-p {ranks} -m {microbatches} -v {chunks}{who} make up to {total} actions")


def check_gpt_size(*, layers: int, d_model: int, heads: int, seq: int, vocab: int, batch: int,
                   experts: int = 0, shared: int = 0) -> None:
    """The built-in GPT's sizes (``batch``: sequences in one micro-batch; ``experts`` and ``shared``: the routed
    and shared MLPs per block of a mixture of experts, each named in the message), before a tensor is made."""
    LAYERS.check(layers, "`layers_n`")
    tensors = (
        ("`d_model` x 4 `d_model` (one block's MLP weight)", 4 * d_model * d_model),
        ("`vocab` x `d_model` (the embedding)", vocab * d_model),
        ("sequences x `seq` x 4 `d_model` (a block's MLP activation)", batch * seq * 4 * d_model),
        ("sequences x `heads` x `seq`^2 (attention scores)", batch * heads * seq * seq),
        ("sequences x `seq` x `vocab` (the logits)", batch * seq * vocab),
    )
    for what, n in tensors:
        ELEMENTS.check(n, "", detail=f"{what} = {n}")
    params = layers * (4 + 8 * max(1, experts + shared)) * d_model * d_model + (vocab + seq) * d_model
    moe = f" with `moe_experts` {experts} + `moe_shared` {shared} expert MLPs a block" if experts else ""
    PARAMETERS.check(params, "", detail=f"`layers_n` {layers} `d_model` {d_model}{moe} `vocab` {vocab} make about "
                     f"{params} parameters")


def read_text(path: str | Path, option: str) -> str:
    """The UTF-8 text of a regular file no larger than ``FILE_BYTES``.

    Refuses a FIFO, a device (``/dev/zero``) or a folder before reading, reads
    at most one byte over the cap, and names ``option`` and the path in every
    message (``OSError`` and decoding errors become ``LimitError``).
    """
    from pathlib import Path

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
    return "\n".join(f"{lim.env:<31} {lim.value:>12}  {lim.what}" for lim in ALL.values())


def markdown() -> str:
    """The defaults as docs/limits.md's table (tests/test_limits.py holds the page to it)."""
    rows = [f"| `{lim.env}` | {lim.default:,} | {lim.what} | {lim.where} |" for lim in ALL.values()]
    return "\n".join(["| variable | default | what it counts | where |", "|---|---|---|---|", *rows])


@contextmanager
def open_regular(path: str | Path, option: str) -> Iterator[BinaryIO]:
    """``path`` opened for binary reading, once it is known to be a regular file (``read_text``'s rule).

    Opened without blocking (a FIFO with no writer), then refused unless regular (a FIFO, a device such
    as ``/dev/zero``, a folder), so nothing is read from what is not a file. For binary formats that read
    a few parts of a file (a safetensors header) rather than all of it.

    Example:
        >>> with open_regular("/dev/zero", "`source`") as fh:    # doctest: +SKIP
        ...     pass
        LimitError: `source` /dev/zero: not a regular file (a device)
    """
    from pathlib import Path

    path = Path(path)
    try:
        fh = open(path, "rb", opener=_open_nonblocking)
    except IsADirectoryError:
        raise LimitError(f"{option} {path}: not a regular file (a folder)") from None
    except OSError as e:
        raise LimitError(f"{option} {path}: cannot read: {e.strerror or e}") from None
    with fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise LimitError(f"{option} {path}: not a regular file ({_kind(mode)})")
        yield fh


def read_bytes(path: str | Path, option: str) -> bytes:
    """The bytes of a regular file no larger than ``FILE_BYTES`` (``read_text`` without the decoding)."""
    cap = FILE_BYTES.value
    with open_regular(path, option) as fh:
        try:
            data = fh.read(cap + 1)
        except OSError as e:
            raise LimitError(f"{option} {path}: cannot read: {e.strerror or e}") from None
    if len(data) > cap:
        FILE_BYTES.check(len(data), option, detail=f"{option} {path}: more than {cap} bytes")
    return data
