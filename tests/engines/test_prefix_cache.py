"""The hf engine's prefix KV cache: a completion served from cached blocks equals the same request
served cold (ids with the same seed, logprobs within float rounding), a prompt leaving a cached
conversation inside a block, rows with different cached lengths in one batch, LRU eviction under a
small budget, a reload dropping every cached block, a non-joinable cache turning it off, and the
proxy exporting its numbers with records unchanged."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import urllib.request

import openai
import pytest
import torch

from clawgym.engines.base import Sampling
from clawgym.engines.hf import HFEngine
from clawgym.engines.prefix_cache import PrefixCache
from clawgym.proxy import ProxyConfig, ProxyThread, read_records

BLOCK = 16


def run(coro):
    return asyncio.run(coro)


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1999) for _ in range(n)]


@pytest.fixture(scope="module")
def cold(tiny_model):
    engine = HFEngine(tiny_model, prefix_cache=False, prefill_chunk=40)
    yield engine
    run(engine.close())


def warm_engine(model, **kw) -> HFEngine:
    return HFEngine(model, prefix_block=BLOCK, prefill_chunk=40, **kw)


def same(a, b) -> None:
    assert a.output_ids == b.output_ids and a.finish_reason == b.finish_reason
    assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-4)


SEEDED = Sampling(max_tokens=10, temperature=1.0, seed=7)


def test_a_warm_call_equals_the_cold_one_and_computes_only_its_new_tokens(tiny_model, cold):
    eng = warm_engine(tiny_model)
    first = prompt(150, 1)
    g1 = run(eng.generate(first, SEEDED))
    same(g1, run(cold.generate(first, SEEDED)))
    s = eng.stats()
    assert s["prompt_tokens_cached"] == 0 and s["prompt_tokens_computed"] == 150
    assert s["cached_tokens"] >= 144  # the prompt's 9 full blocks, and its output's
    # the rollout's next call: its prompt + what it sampled + a tool result
    second = first + g1.output_ids + prompt(20, 2)
    g2 = run(eng.generate(second, SEEDED))
    same(g2, run(cold.generate(second, SEEDED)))
    s2 = eng.stats()
    reused = s2["prompt_tokens_cached"]
    assert reused == (150 + len(g1.output_ids) - 1) // BLOCK * BLOCK  # prompt and output, forwarded ones
    assert s2["prompt_tokens_computed"] - s["prompt_tokens_computed"] == len(second) - reused
    assert s2["requests_hit"] == 1 and 0 < s2["hit_rate"] < 1 and s2["computed_share"] == pytest.approx(1 - s2["hit_rate"])
    # the very same prompt again: all but the block holding its last token comes from the cache
    same(run(eng.generate(first, SEEDED)), g1)
    greedy = Sampling(max_tokens=6, temperature=0.0)
    same(run(eng.generate(second, greedy)), run(cold.generate(second, greedy)))
    run(eng.close())


def test_a_prompt_that_diverges_inside_a_cached_block(tiny_model, cold):
    eng = warm_engine(tiny_model)
    base = prompt(160, 3)
    run(eng.generate(base, SEEDED))
    before = eng.stats()["prompt_tokens_cached"]
    other = base[:100] + prompt(40, 4)  # differs from token 100, inside block 6 (tokens 96..111)
    assert other[100] != base[100]
    same(run(eng.generate(other, SEEDED)), run(cold.generate(other, SEEDED)))
    assert eng.stats()["prompt_tokens_cached"] - before == 96  # blocks 0..5 only
    run(eng.close())


def test_rows_with_different_cached_lengths_share_one_batch(tiny_model, cold):
    eng = warm_engine(tiny_model, max_batch=8)
    base = prompt(200, 5)
    run(eng.generate(base, SEEDED))
    fresh = prompt(90, 6)
    reqs = [(base + prompt(12, 7), SEEDED),  # 192 cached, 20 new
            (fresh, Sampling(max_tokens=8, temperature=0.8, seed=1)),  # cold
            (base[:70] + prompt(30, 8), Sampling(max_tokens=7, temperature=0.0)),  # 64 cached
            (base, Sampling(max_tokens=9, temperature=1.0, seed=2)),  # all but its last block
            (prompt(120, 9), SEEDED), (prompt(120, 9), SEEDED)]  # the same new prompt twice, at once

    async def together():
        return await asyncio.gather(*[eng.generate(*r) for r in reqs])

    steps = eng.decode_steps
    got = run(together())
    assert eng.decode_steps - steps < sum(r[1].max_tokens for r in reqs)  # rows decoded side by side
    for r, g in zip(reqs, got):
        same(g, run(cold.generate(*r)))
    s = eng.stats()
    # the 20-token suffix prefills in a group of short suffixes (192 of its prefix from the cache), and
    # the second copy of the new prompt, after the first, finds 112 of its 120 tokens
    assert s["prompt_tokens_cached"] >= 192 + 112 and s["requests_hit"] >= 3
    run(eng.close())


def test_prefill_groups_keep_long_suffixes_apart():
    from clawgym.engines.hf_batching import prefill_groups
    from clawgym.engines.prefix_cache import PrefixHit

    class J:
        def __init__(self, n):
            self.prompt_ids = [0] * n

    items = [(J(6000), PrefixHit(0)), (J(6050), PrefixHit(5984)), (J(6100), PrefixHit(5984)), (J(40), PrefixHit(0))]
    groups = prefill_groups(items)
    sizes = [[len(j.prompt_ids) - h.tokens for j, h in g] for g in groups]
    assert sizes == [[6000], [116, 66, 40]]  # the cold 6k prompt alone; short suffixes share a forward


def test_a_late_request_joins_a_running_batch_from_the_cache(tiny_model, cold):
    eng = warm_engine(tiny_model, max_batch=8)
    base = prompt(100, 10)
    run(eng.generate(base, Sampling(max_tokens=2, temperature=0.0)))
    early = (prompt(30, 11), Sampling(max_tokens=30, temperature=1.0, seed=3))
    late = (base + prompt(5, 12), Sampling(max_tokens=5, temperature=0.9, seed=5))

    async def go():
        first = asyncio.ensure_future(eng.generate(*early))
        start = eng.decode_steps
        while eng.decode_steps < start + 3:
            await asyncio.sleep(0.005)
        second = await eng.generate(*late)
        assert not first.done()
        return await first, second

    a, b = run(go())
    same(a, run(cold.generate(*early)))
    same(b, run(cold.generate(*late)))
    run(eng.close())


def test_bad_cache_options_are_one_line_errors(tiny_model):
    from clawgym.engines import EngineConfig, make_engine
    from clawgym.errors import UserError

    for key, value in (("prefix_cache_bytes", "lots"), ("prefix_cache_bytes", -1), ("prefix_block", 0)):
        with pytest.raises(UserError, match=f"engine option {key}=.*whole number"):
            make_engine("hf", EngineConfig(tiny_model, {key: value}))
    eng = make_engine("hf", EngineConfig(tiny_model, {"prefix_cache_bytes": 0}))  # 0 bytes: no cache
    assert eng.stats()["enabled"] == 0
    run(eng.close())


def test_lru_eviction_keeps_the_budget_and_chain_starts():
    block = torch.zeros(2, 2, 1, 4, 8)  # 2 layers, keys+values, 1 head, 4 tokens, dim 8: 512 bytes
    cache = PrefixCache(budget_bytes=4 * 512, block=4)

    def kv_of(s, e):
        return torch.arange(s, e, dtype=torch.float32).view(1, 1, 1, -1, 1).expand(2, 2, 1, e - s, 8).clone()

    a, b = list(range(100, 112)), list(range(200, 208))
    assert cache.insert(a, kv_of) == 3 and cache.insert(b, kv_of) == 2  # 5 blocks > 4: one evicted
    snap = cache.snapshot()
    assert snap.bytes <= snap.budget_bytes and snap.cached_blocks == 4 and snap.evicted_blocks == 1
    assert cache.lookup(a, 12).tokens == 8  # a's last block went first, its start stayed
    hit = cache.lookup(b, 8)
    assert hit.tokens == 8 and torch.equal(hit.blocks[1][0, 0, 0, :, 0], torch.tensor([4.0, 5, 6, 7]))
    cache.lookup(a, 12)  # a used again: b is now the least recent
    cache.insert(list(range(300, 308)), kv_of)
    assert cache.lookup(b, 8).tokens == 0 and cache.lookup(a, 12).tokens == 8
    assert cache.lookup(a[:6] + [1, 2, 3, 4, 5, 6], 12).tokens == 4  # diverging inside block 1
    assert block.numel() * 4 == 512
    cache.clear()
    assert cache.lookup(a, 12).tokens == 0 and cache.snapshot().bytes == 0


def test_an_engine_under_a_small_budget_evicts_and_stays_exact(tiny_model, cold):
    per_token = 2 * 2 * 1 * 64 * 4  # tiny model: 2 layers, keys+values, 1 KV head of 64, fp32
    eng = warm_engine(tiny_model, prefix_cache_bytes=200 * per_token)
    a, b = prompt(150, 13), prompt(150, 14)
    for p in (a, b, a + prompt(10, 15)):
        same(run(eng.generate(p, SEEDED)), run(cold.generate(p, SEEDED)))
    s = eng.stats()
    assert s["evicted_blocks"] > 0 and s["bytes"] <= s["budget_bytes"] == 200 * per_token
    run(eng.close())


def test_a_reload_drops_the_cache(tiny_model, tmp_path):
    from clawgym.models.tiny import init_model

    other = tmp_path / "other"
    init_model(other, seed=1, size="tiny")
    eng = warm_engine(tiny_model)
    p = prompt(120, 16)
    run(eng.generate(p, SEEDED))
    assert eng.stats()["cached_tokens"] > 0
    assert run(eng.reload(other)) == 1
    s = eng.stats()
    assert s["cached_tokens"] == 0 and s["bytes"] == 0 and s["resets"] == 1
    after = run(eng.generate(p, SEEDED))
    assert eng.stats()["prompt_tokens_cached"] == 0  # nothing of the old weights was used
    fresh = HFEngine(other, prefix_cache=False)
    same(after, run(fresh.generate(p, SEEDED)))
    run(fresh.close())
    run(eng.close())


def test_a_drop_lets_the_cache_go_and_the_next_call_computes_it_again(tiny_model):
    """`drop_cache` (what `clawgym run` asks for before training) frees every cached block, counts a reset,
    and the same prompt is then computed from token 0 and answered as before."""
    eng = warm_engine(tiny_model)
    p = prompt(120, 16)
    first = run(eng.generate(p, SEEDED))
    held = eng.stats()["bytes"]  # read as the answer arrives: the output's blocks may still be on their way in
    assert held > 0
    assert run(eng.drop_cache()) >= held  # the drop runs after them, in the worker's order
    s = eng.stats()
    assert s["bytes"] == 0 and s["cached_tokens"] == 0 and s["resets"] == 1
    again = run(eng.generate(p, SEEDED))
    assert eng.stats()["prompt_tokens_cached"] == s["prompt_tokens_cached"]  # nothing was found
    same(again, first)
    assert run(eng.drop_cache()) > 0 and eng.policy_version == 0  # the weights stay
    run(eng.close())


@pytest.mark.parametrize("found", ["from the config", "at the first prefill"])
def test_a_sliding_window_model_turns_the_cache_off_once(tiny_model, tmp_path, caplog, monkeypatch, found):
    """Found from the config at the start, or (a cache the config does not predict) by the first
    prefill, whose admitted companions then wait for its batch instead of joining it."""
    if found == "at the first prefill":
        monkeypatch.setattr("clawgym.engines.hf.plain_attention", lambda config: True)
    model = tmp_path / "sliding"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=64, max_window_layers=0,
               layer_types=["sliding_attention", "full_attention"])
    (model / "config.json").write_text(json.dumps(cfg))
    eng = warm_engine(model)
    p = prompt(100, 17)
    async def together():  # the same prompt twice at once: the second waits for the first's prefill
        return await asyncio.gather(eng.generate(p, SEEDED), eng.generate(p, SEEDED))

    with caplog.at_level(logging.WARNING, logger="clawgym.engines.hf"):
        a, b = run(together())
        c = run(eng.generate(p, SEEDED))
    same(a, b)
    same(a, c)
    assert len([r for r in caplog.records if "prefix cache off" in r.message]) == 1
    s = eng.stats()
    assert s["enabled"] == 0 and s["prompt_tokens_cached"] == 0 and s["prompt_tokens_computed"] == 300
    run(eng.close())


def test_the_proxy_exports_the_cache_and_records_what_a_cold_engine_records(tiny_model, tmp_path):
    def converse(options: dict, name: str):
        config = ProxyConfig(model_dir=tiny_model, engine="hf", port=0, records_dir=tmp_path / name,
                             engine_options={"prefix_block": BLOCK, **options})
        with ProxyThread(config) as p:
            reg = p.register("r")
            client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
            messages = [{"role": "system", "content": "You are terse. " * 20}, {"role": "user", "content": "Say something."}]
            for i in range(3):
                r = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=8, seed=i)
                messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                             {"role": "user", "content": f"Go on ({i})."}]
            p.settle("r")
            req = urllib.request.Request(p.url + "/admin/metrics", headers={"Authorization": f"Bearer {p.server.admin_token}"})
            text = urllib.request.urlopen(req).read().decode()
            req = urllib.request.Request(p.url + "/admin/engine/cache", method="DELETE",
                                         headers={"Authorization": f"Bearer {p.server.admin_token}"})
            dropped = json.loads(urllib.request.urlopen(req).read())
            return read_records(tmp_path / name / "r.jsonl"), text, dropped

    warm, text, dropped = converse({}, "warm")
    cold_recs, cold_text, cold_dropped = converse({"prefix_cache": False}, "cold")
    assert dropped["dropped"] and dropped["freed_bytes"] > 0 and cold_dropped == {"dropped": True, "freed_bytes": 0}
    for w, c in zip(warm, cold_recs, strict=True):
        assert w.prompt_ids == c.prompt_ids and w.output_ids == c.output_ids
        assert w.output_logprobs == pytest.approx(c.output_logprobs, abs=1e-4)
    metrics = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("clawgym_engine_"))
    for name in ("hit_rate", "computed_share", "cached_tokens", "evicted_blocks", "bytes", "budget_bytes"):
        assert f"clawgym_engine_{name}" in metrics
    assert 0 < float(metrics["clawgym_engine_hit_rate"]) < 1 and float(metrics["clawgym_engine_bytes"]) > 0
    assert "clawgym_engine_enabled 0" in cold_text and "clawgym_engine_computed_share 1" in cold_text
