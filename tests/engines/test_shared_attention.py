"""Shared-prefix decode attention: the split equals plain attention, and the engine serves the same tokens with it."""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F

from clawgym.engines import Sampling
from clawgym.engines import shared_attention as sa
from clawgym.engines.hf import HFEngine


def test_common_prefix():
    assert sa.common_prefix([]) == 0
    assert sa.common_prefix([[1, 2, 3]]) == 3
    assert sa.common_prefix([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3]]) == 2
    assert sa.common_prefix([[5, 1], [1, 5]]) == 0


def batch(lens: list[int], shared: int, hkv: int = 2, g: int = 3, d: int = 8, seed: int = 0):
    """Right-aligned keys/values [B, Hkv, W, D] whose rows hold the same `shared` leading tokens, a mask [B, W]
    and one query per row [B, H, 1, D]."""
    gen = torch.Generator().manual_seed(seed)
    B, W = len(lens), max(lens)
    k0, v0 = torch.randn(hkv, shared, d, generator=gen), torch.randn(hkv, shared, d, generator=gen)
    key, value = torch.zeros(B, hkv, W, d), torch.zeros(B, hkv, W, d)
    mask = torch.zeros(B, W, dtype=torch.long)
    for i, n in enumerate(lens):
        s = W - n
        key[i, :, s:s + shared], value[i, :, s:s + shared] = k0, v0
        key[i, :, s + shared:] = torch.randn(hkv, n - shared, d, generator=gen)
        value[i, :, s + shared:] = torch.randn(hkv, n - shared, d, generator=gen)
        mask[i, s:] = 1
    return key, value, mask, torch.randn(B, hkv * g, 1, d, generator=gen)


def plain(query, key, value, mask, scaling):
    """SDPA per row over its own keys, with the key heads repeated: [B, 1, H, D]."""
    g = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(query, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1),
                                         attn_mask=mask.bool()[:, None, None, :], scale=scaling)
    return out.transpose(1, 2)


@pytest.mark.parametrize("lens", [[300, 300, 300], [140, 260, 500, 201]], ids=["same-length", "ragged"])
def test_split_attention_equals_plain_attention(lens):
    shared = 130
    key, value, mask, query = batch(lens, shared)
    p = sa.plan(mask, shared)
    assert p is not None and p.length == shared and p.own == max(lens) - shared
    # each row's own columns are exactly its tokens after the shared ones
    assert p.valid[:, 0, 0].sum(1).tolist() == [n - shared for n in lens]
    got = sa.attend(query, key, value, p, 0.3)
    assert got.shape == (len(lens), 1, query.shape[1], query.shape[-1])
    torch.testing.assert_close(got, plain(query, key, value, mask, 0.3), atol=1e-5, rtol=1e-5)


def test_plan_declines_what_plain_attention_does_as_well():
    _, _, mask, _ = batch([300, 300], 200)
    assert sa.plan(mask, sa.MIN_SHARED - 1) is None  # too little shared
    assert sa.plan(mask[:1], 200) is None  # one row
    assert sa.plan(mask, 300) is None  # a row with nothing of its own (cannot happen while decoding)


def test_attention_function_falls_back_to_sdpa_without_a_plan():
    key, value, mask, query = batch([300, 300], 200)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    m4 = mask.bool()[:, None, None, :]
    out, _ = sa.shared_decode_attention(module, query, key, value, m4, scaling=0.3)
    torch.testing.assert_close(out, plain(query, key, value, mask, 0.3), atol=1e-5, rtol=1e-5)
    p = sa.plan(mask, 200)
    out2, _ = sa.shared_decode_attention(module, query, key, value, m4, scaling=0.3, **{sa.PLAN_KWARG: p})
    torch.testing.assert_close(out2, out, atol=1e-5, rtol=1e-5)


def test_a_masked_grouped_query_prefill_reads_the_key_heads_in_place(monkeypatch):
    """A prefill chunk (several query tokens) under grouped-query attention with a padding mask gives what
    transformers' SDPA function gives, without its copy of every key/value head (repeat_kv)."""
    from transformers.integrations import sdpa_attention

    gen = torch.Generator().manual_seed(1)
    B, hkv, g, T, W, d = 3, 2, 3, 5, 40, 8
    query = torch.randn(B, hkv * g, T, d, generator=gen)
    key, value = torch.randn(B, hkv, W, d, generator=gen), torch.randn(B, hkv, W, d, generator=gen)
    mask = torch.ones(B, 1, T, W, dtype=torch.bool).tril(W - T)  # causal over the chunk, all of the past
    mask[1, :, :, :7] = False  # a left-padded row
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = g, True
    want, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)

    def no_copy(*a, **k):
        raise AssertionError("repeat_kv called")

    monkeypatch.setattr(sdpa_attention, "repeat_kv", no_copy)
    got, _ = sa.shared_decode_attention(module, query, key, value, mask, scaling=0.3)
    assert got.shape == (B, T, hkv * g, d)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    with pytest.raises(AssertionError, match="repeat_kv"):  # the same call transformers makes copies the heads
        sdpa_attention.sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)


def test_engine_with_shared_attention_samples_what_it_samples_without(tiny_model):
    """Rows that share a long prompt prefix (a GRPO group, two tasks of one harness) decode through the split,
    and sample the same ids with the same logprobs as the engine without it; a late row joins the running batch."""
    common = [(7 * j) % 90 + 5 for j in range(170)]
    prompts = [common + [11, 12, 13], common + [11, 12, 13], common + [40] * (5 + 9 * 3), common[:150] + [3, 4]]

    async def go(engine):
        first = [engine.generate(p, Sampling(max_tokens=20, temperature=1.0, seed=i)) for i, p in enumerate(prompts[:3])]
        running = asyncio.gather(*first)
        while engine.decode_steps < 3:
            await asyncio.sleep(0.005)
        late = await engine.generate(prompts[3], Sampling(max_tokens=6, temperature=0.0))
        return [*await running, late]

    outs = {}
    for on in (True, False):
        engine = HFEngine(tiny_model, max_batch=8, shared_attention=on)
        assert (engine.model.config._attn_implementation == sa.IMPLEMENTATION) is on
        outs[on] = asyncio.run(go(engine))
        steps = engine.stats()["shared_decode_steps"]
        assert (steps > 0) is on
        asyncio.run(engine.close())
    for a, b in zip(outs[True], outs[False]):
        assert a.output_ids == b.output_ids and a.finish_reason == b.finish_reason
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-5)
