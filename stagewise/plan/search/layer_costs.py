"""What the partitioners balance: one number per layer and micro-batch, and the runs of identical layers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class LayerCosts:
    """Per-layer numbers for one micro-batch; what the partitioner balances."""

    time: tuple[float, ...]  #: work of the layer per micro-batch (F + B, + F again if recomputed)
    fixed: tuple[float, ...]  #: bytes held whatever the schedule (parameters x state factor)
    act: tuple[float, ...]  #: activation bytes kept per micro-batch in flight
    #: with recomputation: bytes of each layer's input (a recomputed piece keeps only its input)
    input_bytes: tuple[float, ...] | None = None


def runs_of(lc: LayerCosts) -> list[tuple[int, int]]:
    """Maximal [start, end) ranges of layers with identical numbers."""
    key = [(lc.time[i], lc.fixed[i], lc.act[i], lc.input_bytes[i] if lc.input_bytes else 0.0)
           for i in range(len(lc.time))]
    runs, lo = [], 0
    for i in range(1, len(key) + 1):
        if i == len(key) or key[i] != key[lo]:
            runs.append((lo, i))
            lo = i
    return runs
