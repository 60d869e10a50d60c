"""Training data as real data is: documents of any length packed into micro-batches of one token budget.

``packing`` (pure Python, no torch) plans a step: which documents go in which row of ``budget`` tokens
(first-fit-decreasing), and which rows go to which data-parallel rank and micro-batch (tokens balanced).
``tensors`` (torch) builds a plan's rows: token ids, per-document position ids (0 at each document's start),
document ids (attention stays within a document: ``block_mask``) and targets with ``-100`` on padding.
The built-in GPT (``train --pack``), ``train --hf --pack`` and a user's own model all take these tensors
(docs/packing.md).

May import: the core, `torch`.
"""

from .packing import DataError, Packing, Row, fitting, pack

__all__ = ["DataError", "Packing", "Row", "fitting", "pack"]
