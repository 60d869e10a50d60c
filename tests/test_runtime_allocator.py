"""Host allocator settings for CPU ranks (runtime/launching/allocator.py)."""

from __future__ import annotations

import sys

import pytest

from stagewise.runtime.launching.allocator import keep_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_keeps_freed_memory_and_asking_twice_is_harmless():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True
