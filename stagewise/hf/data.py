"""Training text for a causal LM: a file as token ids (bytes, or a local tokenizer's), cut into random windows.

A step's batch is ``size`` windows of ``seq`` tokens at seeded random offsets;
inputs and labels are the same ids, as in ``model(input_ids, labels=input_ids)``
(transformers shifts the labels inside its loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import limits
from .errors import HFError, within
from .files import inside, one_line

BYTES = 256  #: the vocabulary byte-level tokens need
#: the files ``AutoTokenizer`` may open in a tokenizer folder: each is checked before it does
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json", "config.json")


@dataclass(frozen=True, kw_only=True)
class TextData:
    """A text file as training batches.

    >>> data = TextData(path="train.txt", seq=128)      # doctest: +SKIP
    >>> data.check(model.config, batch=8)                # doctest: +SKIP
    >>> ids, labels = data.batch(step=0, size=8)         # (8, 128) each; labels is ids
    """

    path: str  #: the text file
    seq: int  #: tokens per sequence
    tokenizer: str | None = None  #: a local tokenizer folder; None = byte-level tokens (ids 0..255)
    seed: int = 0

    def check(self, config, batch: int | None = None) -> None:
        """The text and the model agree: vocabulary, sequence length against positions, enough tokens; with
        ``batch`` (sequences per step) also a step's tokens against ``STAGEWISE_MAX_TOKENS`` (``check_batch``).

        Reads (and tokenizes) the file once per process; ``HFError`` names the argument and the rule.
        """
        vocab = int(config.vocab_size)
        if not isinstance(self.seq, int) or isinstance(self.seq, bool) or self.seq < 1:
            raise HFError(f"`seq` {self.seq!r}: must be a whole number >= 1")
        if batch is not None:
            self.check_batch(batch)
        if self.tokenizer is None and vocab < BYTES:
            raise HFError(f"`data` without `tokenizer` reads byte tokens (0..255); the model's vocab_size is {vocab}; "
                          "give a `tokenizer` folder or a config with vocab_size >= 256")
        if config.model_type == "gpt2" and self.seq > config.max_position_embeddings:
            raise HFError(f"`seq` {self.seq} exceeds the model's {config.max_position_embeddings} learned positions "
                          "(n_positions)")
        toks = self.tokens()
        if len(toks) < self.seq:
            raise HFError(f"`data` {self.path}: {len(toks)} tokens; needs at least `seq` = {self.seq}")
        top = int(toks.max())
        if top >= vocab:
            raise HFError(f"`tokenizer` {self.tokenizer} gives token id {top}; the model's vocab_size is {vocab}")

    def check_batch(self, size: int) -> None:
        """A step of ``size`` sequences: ``size`` x ``seq`` tokens within ``STAGEWISE_MAX_TOKENS``.

        >>> TextData(path="t.txt", seq=32).check_batch(1048576)   # doctest: +SKIP
        HFError: `batch` 1048576 x `seq` 32 = 33554432 tokens: over the limit of 16777216 tokens per step; ...
        """
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise HFError(f"`batch` {size!r}: must be a whole number >= 1")
        within(limits.TOKENS, size * self.seq, f"`batch` {size} x `seq` {self.seq} = {size * self.seq} tokens")

    def tokens(self):
        """The whole file as a 1-D LongTensor (read once per process)."""
        key = (self.path, self.tokenizer)
        if key not in _TOKENS:
            _TOKENS[key] = _read(self.path, self.tokenizer)
        return _TOKENS[key]

    def batch(self, step: int, size: int):
        """Step ``step``'s (input_ids, labels): ``size`` windows of ``seq`` tokens; labels are the ids."""
        import torch

        self.check_batch(size)  # before anything of that size is made
        toks = self.tokens()
        if len(toks) < self.seq:
            raise HFError(f"`data` {self.path}: {len(toks)} tokens; needs at least `seq` = {self.seq}")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(toks) - self.seq + 1, (size,), generator=g)
        ids = toks[starts[:, None] + torch.arange(self.seq)]  # one gather: (size, seq)
        return ids, ids


_TOKENS: dict = {}


def _read(path: str, tokenizer: str | None):
    """The file's token ids: it must be a regular file within ``FILE_BYTES`` and make at least one token."""
    import torch

    try:
        raw = limits.read_bytes(path, "`data`")
    except limits.LimitError as e:
        raise HFError(str(e)) from None
    if not raw:
        raise HFError(f"`data` {path}: an empty file; give a text file of at least `seq` tokens")
    if tokenizer is None:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    tok = _tokenizer(tokenizer)
    try:
        ids = tok(raw.decode("utf-8", errors="replace"))["input_ids"]
    except Exception as e:  # noqa: BLE001 - the tokenizer's own failure, said in one line
        raise HFError(f"`tokenizer` {tokenizer}: cannot tokenize `data` {path}: {one_line(e)}") from None
    if not ids:
        raise HFError(f"`data` {path}: `tokenizer` {tokenizer} makes no tokens of it")
    return torch.tensor(ids, dtype=torch.long)


def _tokenizer(folder: str):
    """``AutoTokenizer`` of a local folder, after its files are checked (regular, inside, bounded)."""
    from transformers import AutoTokenizer

    path = Path(folder)
    if not path.is_dir():
        raise HFError(f"`tokenizer` {folder}: not a folder (give a local tokenizer folder; nothing is downloaded)")
    for name in TOKENIZER_FILES:
        file = path / name
        if file.is_symlink() or file.exists():
            size = inside(path, name, f"`tokenizer` {folder}").stat().st_size
            within(limits.FILE_BYTES, size, f"{file}: {size} bytes")
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers' and tokenizers' own refusals, said in one line
        raise HFError(f"`tokenizer` {folder}: not a tokenizer folder ({one_line(e)})") from None
