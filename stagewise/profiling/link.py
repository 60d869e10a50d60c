"""Point-to-point time between two local ranks (gloo on loopback), for the planner's link model."""

from __future__ import annotations

import statistics
import time
from typing import Sequence

from ..plan.search import Link


def measure_link(sizes: Sequence[int] = (1 << 10, 1 << 16, 1 << 20, 1 << 22), repeats: int = 10) -> Link:
    """Point-to-point time between two local ranks (gloo on loopback), fitted to latency + bytes / bandwidth.

    The ranks are started by the runtime's own launcher (``stagewise.launch``).
    """
    from ..runtime.launching.launch import RankFailure
    from ..runtime.launching.local import launch

    try:
        samples = launch(ping_pong, 2, tuple(sizes), repeats, timeout=120)
    except RankFailure as e:
        raise RuntimeError(f"link measurement failed: {e}") from None
    latency, bandwidth = fit_link(samples)
    return Link(latency=latency, bandwidth=bandwidth, samples=tuple(samples), backend="gloo")


def fit_link(samples) -> tuple[float, float]:
    """seconds = latency + bytes / bandwidth through the smallest and the largest message.

    Latency dominates small messages and bandwidth large ones; when the two take about
    the same time (a fast link), the largest message alone bounds the bandwidth.
    """
    (b0, t0), (b1, t1) = min(samples), max(samples)
    latency = max(0.0, t0 - b0 * (t1 - t0) / (b1 - b0)) if b1 > b0 else t0
    spent = t1 - latency
    bandwidth = b1 / spent if spent > 0.05 * t1 else b1 / (0.05 * t1)
    return latency, bandwidth


def ping_pong(sizes, repeats: int) -> list[tuple[float, float]]:
    """Ping-pong between ranks 0 and 1 of the current process group: (bytes, one-way seconds) medians,
    after two warm-up round trips per size. Called inside a launched rank (``launch(ping_pong, 2, ...)``)."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    torch.set_num_threads(1)
    out = []
    for size in sizes:
        t = torch.zeros(max(1, size // 4), dtype=torch.float32)
        times = []
        for k in range(repeats + 2):
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
            if k >= 2:
                times.append((time.perf_counter() - t0) / 2)
        out.append((float(t.numel() * 4), statistics.median(times)))
    return out
