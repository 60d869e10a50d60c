"""A published long-tailed document-length distribution, and documents drawn from it.

The histogram is BERT's Wikipedia pre-training set at sequence length 512 (16,279,552 sequences), from Krell
et al., "Efficient Sequence Packing without Cross-contamination" (arXiv:2107.02027), published with the paper
as ``wikipedia_histogram`` in graphcore/tutorials ``blogs_code/packedBERT/histograms.py`` (MIT). Here its 512
counts are summed into 32-token bins, and the last length (512: sequences cut at the limit, 23.4% of them) is
its own bin. At 512 it is 50.0% padding, the paper's "in excess of 50%"; ``PADDING_AT_512`` is that figure
from the full histogram. Lengths are scaled to a budget (``length * budget / 512``, rounded up).

>>> import random
>>> draw(random.Random(3), tokens=200, budget=64)
[10, 20, 37, 40, 10, 12, 32, 18, 10, 64]
"""

from __future__ import annotations

import math
import random

LIMIT = 512  #: the histogram's sequence length
#: sequences whose length is in (32 i, 32 (i + 1)], i = 0..15 (the last bin without 512 itself)
BINS = (584835, 2278244, 1853320, 1297484, 1014430, 841112, 720373, 629192, 554205, 496001, 449775, 409734,
        375272, 347246, 321394, 291891)
AT_LIMIT = 3815044  #: sequences of exactly 512 tokens (documents cut at the limit)
PADDING_AT_512 = 0.5003  #: padding of the full histogram at 512 (1 - mean length / 512)


def length(rng: random.Random, budget: int = LIMIT) -> int:
    """One document's length: a bin drawn by its count, a length uniform in it, scaled to ``budget``."""
    i = rng.choices(range(len(BINS) + 1), weights=BINS + (AT_LIMIT,))[0]
    n = LIMIT if i == len(BINS) else rng.randint(32 * i + 1, 32 * (i + 1))
    return max(1, math.ceil(n * budget / LIMIT))


def draw(rng: random.Random, tokens: int, budget: int = LIMIT) -> list[int]:
    """Document lengths until their sum reaches ``tokens`` (a step's token places)."""
    out, total = [], 0
    while total < tokens:
        out.append(length(rng, budget))
        total += out[-1]
    return out
