"""The per-phase peak memory figure: it rises with what a phase allocates and starts again at a reset."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from clawgym import peak_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the high-water reset is Linux's")
def test_a_phase_peak_sees_its_own_allocation_and_a_reset_forgets_it():
    assert peak_memory.reset()
    before = peak_memory.peak_gib()
    held = torch.ones(96 * 2**20)  # 384 MiB, every page written
    during = peak_memory.peak_gib()
    assert during - before > 0.3, (before, during)
    del held
    assert peak_memory.reset()
    after = peak_memory.peak_gib()
    assert during - after > 0.3, (during, after)  # the freed block is gone from the new high-water mark


RELEASE = """
from clawgym import peak_memory
rss = lambda: peak_memory.status_bytes("VmRSS") / 2**20
blocks = [bytearray(8192) for _ in range(40_000)]  # about 320 MiB of heap blocks below the mmap threshold
for b in blocks:
    b[::4096] = b"x" * len(b[::4096])  # every page touched
keep = blocks[-1]  # the heap's top stays in use, so free() alone cannot shrink it
del blocks
freed = rss()
released = peak_memory.release()
print(freed, rss(), released)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_returns_the_freed_heap_to_the_os():
    """A phase's freed small blocks stay resident under glibc until they are trimmed (docs: peak_memory.py)."""
    out = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, timeout=120, check=True)
    freed, released, ok = out.stdout.split()
    assert ok == "True"
    assert float(freed) - float(released) > 250, out.stdout  # MiB handed back that free() had kept
