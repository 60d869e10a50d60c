"""Training text for a causal LM: a file as token ids (bytes, or a local tokenizer's), cut into random windows.

A step's batch is ``size`` windows of ``seq`` tokens at seeded random offsets;
inputs and labels are the same ids, as in ``model(input_ids, labels=input_ids)``
(transformers shifts the labels inside its loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import HFError

BYTES = 256  #: the vocabulary byte-level tokens need


@dataclass(frozen=True, kw_only=True)
class TextData:
    """A text file as training batches.

    >>> data = TextData(path="train.txt", seq=128)      # doctest: +SKIP
    >>> ids, labels = data.batch(step=0, size=8)         # (8, 128) each; labels is ids
    """

    path: str  #: the text file
    seq: int  #: tokens per sequence
    tokenizer: str | None = None  #: a local tokenizer folder; None = byte-level tokens (ids 0..255)
    seed: int = 0

    def check(self, config) -> None:
        """The text and the model agree: vocabulary, sequence length against positions, enough tokens."""
        vocab = int(config.vocab_size)
        if self.seq < 1:
            raise HFError(f"--seq must be >= 1; got {self.seq}")
        if self.tokenizer is None and vocab < BYTES:
            raise HFError(f"--data without --tokenizer reads byte tokens (0..255); the model's vocab_size is {vocab}; "
                          "give --tokenizer FOLDER or a config with vocab_size >= 256")
        if config.model_type == "gpt2" and self.seq > config.max_position_embeddings:
            raise HFError(f"--seq {self.seq} exceeds the model's {config.max_position_embeddings} learned positions "
                          "(n_positions)")
        toks = self.tokens()
        if len(toks) < self.seq:
            raise HFError(f"--data {self.path}: {len(toks)} tokens; needs at least --seq = {self.seq}")
        top = int(toks.max())
        if top >= vocab:
            raise HFError(f"--tokenizer {self.tokenizer} gives token id {top}; the model's vocab_size is {vocab}")

    def tokens(self):
        """The whole file as a 1-D LongTensor (read once per process)."""
        key = (self.path, self.tokenizer)
        if key not in _TOKENS:
            _TOKENS[key] = _read(self.path, self.tokenizer)
        return _TOKENS[key]

    def batch(self, step: int, size: int):
        """Step ``step``'s (input_ids, labels): ``size`` windows of ``seq`` tokens; labels are the ids."""
        import torch

        toks = self.tokens()
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, len(toks) - self.seq + 1, (size,), generator=g)
        ids = torch.stack([toks[s:s + self.seq] for s in starts.tolist()])
        return ids, ids


_TOKENS: dict = {}


def _read(path: str, tokenizer: str | None):
    import torch

    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise HFError(f"--data {path}: cannot read: {e.strerror}") from None
    if tokenizer is None:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    from transformers import AutoTokenizer

    if not Path(tokenizer).is_dir():
        raise HFError(f"--tokenizer {tokenizer}: not a folder (give a local tokenizer folder; nothing is downloaded)")
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    except (OSError, ValueError) as e:
        raise HFError(f"--tokenizer {tokenizer}: not a tokenizer folder ({str(e).splitlines()[0]})") from None
    return torch.tensor(tok(raw.decode("utf-8", errors="replace"))["input_ids"], dtype=torch.long)
