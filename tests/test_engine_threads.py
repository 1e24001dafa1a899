"""The hf engine's thread tuner: it runs each kind of forward with whichever of 1 and N threads was
faster, tries the slower one again after a number of forwards that grows with the gap, and keeps
to one count when told to."""

from __future__ import annotations

import torch

from clawgym.engines.threads import ThreadTuner, decode_kind


def test_the_tuner_prefers_the_faster_count_and_retries_the_slower_now_and_then():
    before = torch.get_num_threads()
    try:
        t = ThreadTuner(most=2, explore_every=4)
        assert t.pick("decode1") == 1 and torch.get_num_threads() == 1  # each count is timed once first
        t.record("decode1", 1, 0.4)
        assert t.pick("decode1") == 2 and torch.get_num_threads() == 2
        t.record("decode1", 2, 0.1)  # 2 threads are 4x faster: 4 x 4 forwards before 1 thread is tried again
        picks = [t.pick("decode1") for _ in range(16)]
        assert picks == [2] * 15 + [1] and t.best("decode1") == 2
        for _ in range(10):  # the load changed: 1 thread is now the faster
            t.record("decode1", 2, 1.0)
        assert t.best("decode1") == 1 and t.pick("decode1") == 1
        t.record("prefill", 1, 2.0, work=1000)
        assert t.ema[("prefill", 1)] == 0.002  # seconds per token
        fixed = ThreadTuner(most=2, adaptive=False)
        assert {fixed.pick("decode1") for _ in range(40)} == {2}
    finally:
        torch.set_num_threads(before)


def test_decode_steps_are_timed_per_batch_size_bucket():
    assert [decode_kind(n) for n in (1, 2, 3, 4, 7, 8, 15, 16)] == \
        ["decode1", "decode2", "decode2", "decode4", "decode4", "decode8", "decode8", "decode16"]
