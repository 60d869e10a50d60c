"""A packing plan's tensors (torch): what a packed micro-batch is, and the attention mask it implies.

A packed batch is the pair (inputs, targets): inputs a dict of three ``(rows, budget)`` integer tensors,

- ``input_ids``: each row's documents' tokens one after another, then ``PAD_ID`` (0);
- ``position_ids``: each token's place in its own document (0 at every document's start; 0 on padding);
- ``document_ids``: which document of the row a token belongs to (0, 1, ...; ``PAD_DOCUMENT`` on padding);

and targets ``(rows, budget)`` with ``IGNORE`` (-100, what ``cross_entropy`` skips) on padding, so a mean
loss over the targets counts real tokens only. ``block_mask`` turns document ids into the boolean mask
(True: may attend) that keeps attention causal and within each document, which
``torch.nn.functional.scaled_dot_product_attention`` takes as ``attn_mask``.

>>> import torch
>>> from stagewise.data import pack
>>> p = pack([3, 2], budget=6)
>>> x, y = build(p, [torch.tensor([5, 6, 7]), torch.tensor([8, 9])], [torch.tensor([6, 7, 1]), torch.tensor([9, 1])])
>>> x["input_ids"].tolist(), x["position_ids"].tolist(), x["document_ids"].tolist(), y.tolist()
([[5, 6, 7, 8, 9, 0]], [[0, 1, 2, 0, 1, 0]], [[0, 0, 0, 1, 1, -1]], [[6, 7, 1, 9, 1, -100]])
>>> block_mask(x["document_ids"])[0, 0].int().tolist()[3]
[0, 0, 0, 1, 0, 0]
"""

from __future__ import annotations

from typing import Sequence

import torch

from .packing import DataError, Packing

PAD_ID = 0  #: the token id on padding (its target is IGNORE, and no real token attends to it)
PAD_DOCUMENT = -1  #: the document id of padding
IGNORE = -100  #: the target of a padding token (cross_entropy's ignore_index)
KEYS = ("input_ids", "position_ids", "document_ids")  #: a packed micro-batch's input keys


def build(packing: Packing, inputs: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]
          ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The step's packed (inputs, targets): ``inputs[i]`` and ``targets[i]`` are document ``i``'s 1-D token
    ids and targets (as many as the length ``pack`` was given); a split document's pieces are its slices."""
    pieces = _pieces(packing, inputs, targets)
    shape = (len(packing.rows), packing.budget)
    ids = torch.full(shape, PAD_ID, dtype=torch.long)
    pos = torch.zeros(shape, dtype=torch.long)
    doc = torch.full(shape, PAD_DOCUMENT, dtype=torch.long)
    tgt = torch.full(shape, IGNORE, dtype=torch.long)
    for r, row in enumerate(packing.rows):
        at = 0
        for k, (d, n) in enumerate(zip(row.documents, row.lengths)):
            x, y = pieces[d]
            ids[r, at:at + n], tgt[r, at:at + n] = x, y
            pos[r, at:at + n] = torch.arange(n)
            doc[r, at:at + n] = k
            at += n
    return {"input_ids": ids, "position_ids": pos, "document_ids": doc}, tgt


def _pieces(packing: Packing, inputs, targets) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, targets) of each packed document: the documents themselves, or a split one's pieces."""
    if len(inputs) != len(targets):
        raise DataError(f"`targets` has {len(targets)} documents; `inputs` has {len(inputs)}: one each")
    sources = packing.sources if packing.sources is not None else range(len(inputs))
    out, offset = [], {}
    lengths = {d: n for row in packing.rows for d, n in zip(row.documents, row.lengths)}
    for piece, src in enumerate(sources):
        x, y = inputs[src], targets[src]
        if x.dim() != 1 or x.shape != y.shape:
            raise DataError(f"`inputs` item {src}: must be 1-D and the shape of its targets; got "
                            f"{tuple(x.shape)} and {tuple(y.shape)}")
        start, n = offset.get(src, 0), lengths.get(piece, 0)
        if start + n > len(x):
            raise DataError(f"`inputs` item {src} has {len(x)} tokens; the packing gave it more")
        out.append((x[start:start + n], y[start:start + n]))
        offset[src] = start + n
    return out


def block_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` document ids -> ``(B, 1, T, T)`` bool: query ``i`` may attend key ``j`` when ``j <= i`` and both
    are in one document (padding attends to padding only, so no row of the mask is empty)."""
    same = document_ids[:, None, :, None] == document_ids[:, None, None, :]
    t = document_ids.shape[-1]
    return same & torch.ones(t, t, dtype=torch.bool, device=document_ids.device).tril()


def tokens(targets) -> tuple[int, int]:
    """(real tokens, token places) of a batch's targets (any pytree): an integer leaf counts its elements not
    ``IGNORE`` among all its elements, a floating one its rows (dim 0) for both (the token weight of SPEC's
    step loss).

    >>> tokens(torch.tensor([[3, 4, -100], [5, -100, -100]])), tokens(torch.zeros(4, 3))
    ((3, 6), (4, 4))
    """
    from torch.utils._pytree import tree_leaves

    real = places = 0
    for leaf in tree_leaves(targets):
        if not isinstance(leaf, torch.Tensor):
            continue
        if leaf.is_floating_point() or leaf.is_complex() or leaf.dim() == 0:
            rows = leaf.shape[0] if leaf.dim() else 1
            real, places = real + rows, places + rows
        else:
            real, places = real + int((leaf != IGNORE).sum()), places + leaf.numel()
    return real, places


def documents_step(stream: torch.Tensor, *, seed: int, rows: int, budget: int, shares: tuple[int, int] = (1, 1),
                   labels: str = "next", argument: str = "seq") -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A packed step drawn from a token ``stream``: document lengths from the published Wikipedia histogram
    (``wikipedia.py``) scaled to ``budget``, the longest run of them that fits in ``rows`` rows, each a window of
    the stream at a seeded offset, dealt to ``shares`` = (data-parallel shares, micro-batches). The same
    documents for any ``shares``. ``labels``: "next" (targets are the next tokens: the built-in GPT) or "same"
    (targets are the ids, the document's first one ``IGNORE``: an HF model shifts them inside its loss).
    """
    import random

    from . import wikipedia
    from .packing import fitting, pack

    rng = random.Random(seed)
    lengths = wikipedia.draw(rng, rows * budget, budget)
    lengths = lengths[:fitting(lengths, budget, rows)]
    plan = pack(lengths, budget, ranks=shares[0], microbatches=shares[1], rows=rows, argument=argument)
    extra = 1 if labels == "next" else 0
    if len(stream) < budget + extra:
        raise DataError(f"`{argument}` {budget}: the token stream has {len(stream)} tokens; a document needs up "
                        f"to {budget + extra}")
    windows = [stream[s:s + n + extra] for n in lengths for s in [rng.randrange(len(stream) - n - extra + 1)]]
    if labels == "next":
        return build(plan, [w[:-1] for w in windows], [w[1:] for w in windows])
    return build(plan, windows, [torch.cat([torch.tensor([IGNORE]), w[1:]]) for w in windows])


def packed(inputs) -> bool:
    """``inputs`` is a packed micro-batch (the dict ``build`` makes)."""
    return isinstance(inputs, dict) and set(KEYS) <= set(inputs)
