"""Host allocator settings for CPU ranks.

A split backward keeps the graph and the holder-output gradients from I to W,
so a step's peak host memory is higher than with B. glibc then returns the top
of its heap to the OS after each step and every new tensor page-faults again:
measured on the built-in GPT, ~2,000 extra page faults per I+W and ~15% more
time than B, gone with these two settings (benchmarks/bench_split_backward.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_memory(trim_bytes: int = 1 << 30, mmap_bytes: int = 1 << 26) -> bool:
    """Ask glibc to keep freed memory for reuse (no heap trim below ``trim_bytes``, no mmap below ``mmap_bytes``).

    Returns False where there is no glibc ``mallopt`` (other libcs, macOS): nothing changes.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, trim_bytes)) and bool(mallopt(M_MMAP_THRESHOLD, mmap_bytes))
