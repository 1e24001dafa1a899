"""The per-phase peak memory figure: it rises with what a phase allocates and starts again at a reset."""

from __future__ import annotations

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
