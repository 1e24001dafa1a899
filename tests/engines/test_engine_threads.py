"""The hf engine's thread tuner: it runs each kind of forward with whichever of 1 and N threads was
faster, tries the slower one again after a number of forwards that grows with the gap, and keeps
to one count when told to; and its cache layers, which append a decode step's keys in place."""

from __future__ import annotations

import torch

from clawgym.engines.threads import ThreadTuner, decode_kind


def test_the_tuner_prefers_the_faster_count_and_retries_the_slower_now_and_then():
    before = torch.get_num_threads()
    try:
        t = ThreadTuner(most=2, explore_every=4)
        assert t.pick("decode1") == 2 and torch.get_num_threads() == 2  # the most threads first
        t.record("decode1", 2, 0.1)
        assert t.pick("decode1") == 1 and torch.get_num_threads() == 1  # then the other count, timed once
        t.record("decode1", 1, 0.4)
        assert torch.get_num_threads() == 2  # back to the most after the forward (threads started later get it)
        # 2 threads are 4x faster: 4 x 4 forwards before 1 thread is tried again
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


def test_the_tuner_tries_the_other_count_only_on_small_forwards():
    """A long prefill chunk (a harness prompt) always runs with the count known to be best, or the most
    threads before any is known: trying the other on it would cost as much as many small tries."""
    before = torch.get_num_threads()
    try:
        t = ThreadTuner(most=2, explore_every=1, explore_work=512)
        assert t.pick("prefill", work=2048) == 2
        t.record("prefill", 2, 2.0, work=2048)
        assert [t.pick("prefill", work=2048) for _ in range(5)] == [2] * 5  # 1 thread is untried, and stays so
        assert t.pick("prefill", work=300) == 1  # a small forward tries it
        t.record("prefill", 1, 0.1, work=300)  # 1 thread is the faster per token now
        assert t.pick("prefill", work=4000) == 1
        assert t.pick("prefill", work=4000) == 1  # never the slower on a big one, however long since
        assert t.pick("prefill", work=10) == 2  # a small one retries it
        fixed = ThreadTuner(most=2, adaptive=False)
        assert {fixed.pick("decode1") for _ in range(40)} == {2}
    finally:
        torch.set_num_threads(before)


def test_decode_steps_are_timed_per_batch_size_bucket():
    assert [decode_kind(n) for n in (1, 2, 3, 4, 7, 8, 15, 16)] == \
        ["decode1", "decode2", "decode2", "decode4", "decode4", "decode8", "decode8", "decode16"]


def test_a_growing_cache_layer_appends_in_place_and_survives_outside_replacement():
    from transformers.cache_utils import DynamicCache

    from clawgym.engines.hf_cache import growing, joinable

    k0, v0 = torch.randn(2, 1, 5, 4), torch.randn(2, 1, 5, 4)
    cache = growing(DynamicCache(ddp_cache_data=[(k0, v0)]))
    layer = cache.layers[0]
    assert joinable(cache)
    steps = [(torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4)) for _ in range(3)]
    layer.update(*steps[0])
    ptr = layer.keys.data_ptr()
    for k, v in steps[1:]:
        layer.update(k, v)
        assert layer.keys.data_ptr() == ptr  # written into spare room, not copied
    assert torch.equal(layer.keys, torch.cat([k0] + [k for k, _ in steps], dim=2))
    assert torch.equal(layer.values, torch.cat([v0] + [v for _, v in steps], dim=2))
    layer.keys, layer.values = layer.keys[1:, :, 2:], layer.values[1:, :, 2:]  # a cut of rows and columns
    k, v = torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4)
    layer.update(k, v)
    assert torch.equal(layer.keys, torch.cat([k0[1:, :, 2:]] + [k[1:] for k, _ in steps] + [k], dim=2))
    assert layer.get_seq_length() == 7
