"""The proxy with the real hf engine (the tiny random policy): sampled text round-trips through an SDK
with exact tokens and the engine's logprobs, concurrent calls are served, and a weight reload shows up
as a new policy_version in the records."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from clawgym.artifacts import materialize_prompts
from clawgym.proxy import read_records


PROXY = {"engine": "hf", "audit_render": True, "engine_options": {"max_batch": 4}}
"""the module's proxy (conftest `proxy`): the real hf engine"""


def test_sampled_turns_round_trip_token_for_token(proxy, tiny_tokenizer):
    reg = proxy.register("hf-chat")
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]
    texts = []
    for i in range(3):
        r = client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=12, seed=i, temperature=1.0)
        msg = r.choices[0].message
        assert r.usage.completion_tokens == 12 or r.choices[0].finish_reason == "stop"
        texts.append(msg.content or "")
        # Echo whatever the random policy said (odd bytes, stray markup and all), then go on.
        echoed = {"role": "assistant", "content": msg.content or ""}
        if msg.tool_calls:
            echoed["tool_calls"] = [tc.model_dump() for tc in msg.tool_calls]
        messages += [echoed] + [{"role": "tool", "tool_call_id": tc.id, "content": "ok"} for tc in msg.tool_calls or []]
        messages.append({"role": "user", "content": f"Go on ({i})."})
    proxy.settle("hf-chat")
    recs = materialize_prompts(read_records(proxy.config.records_dir / "hf-chat.jsonl"))
    assert len(recs) == 3
    for prev, cur in zip(recs, recs[1:]):
        seq = prev.prompt_ids + prev.output_ids
        assert cur.prompt_ids[: len(seq)] == seq  # the sampled ids, not a re-tokenization of the text
    for rec in recs:
        assert len(rec.output_logprobs) == len(rec.output_ids) > 0
        assert all(lp <= 0.0 for lp in rec.output_logprobs) and any(lp < 0.0 for lp in rec.output_logprobs)
        assert rec.sampling_json and '"temperature":1.0' in rec.sampling_json
    assert proxy.server.metrics.get("clawgym_proxy_render_audit_mismatch_total") == 0


def test_concurrent_calls_and_reload(proxy):
    regs = [proxy.register(f"hf-par{i}") for i in range(4)]

    def one(reg):
        c = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
        stream = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                           max_completion_tokens=8, stream=True)
        return [ch for ch in stream]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, regs))
    assert all(chunks[-1].choices[0].finish_reason in ("stop", "length") for chunks in results)
    for reg in regs:
        proxy.settle(reg["rollout_id"])
        (rec,) = read_records(proxy.config.records_dir / f"{reg['rollout_id']}.jsonl")
        assert rec.status == "ok" and rec.stream and rec.policy_version == 0
    assert proxy.admin("POST", "/admin/reload", {"checkpoint": str(proxy.config.model_dir)})["policy_version"] == 1
    reg = proxy.register("hf-after-reload")
    c = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], max_completion_tokens=4)
    proxy.settle("hf-after-reload")
    (rec,) = read_records(proxy.config.records_dir / "hf-after-reload.jsonl")
    assert rec.policy_version == 1


def test_the_max_tokens_header_caps_a_call_that_sets_no_limit(proxy):
    # Codex sends no max_output_tokens; its adapter caps each call with this header (docs/harnesses.md).
    reg = proxy.register("hf-cap")
    capped = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0,
                           default_headers={"x-clawgym-max-tokens": "3"})
    for seed in range(3):  # the random policy rarely ends a turn within 3 tokens; cut or not, never more
        r = capped.responses.create(model="tiny", input="Say something long.", temperature=1.0, extra_body={"seed": seed})
        assert r.usage.output_tokens <= 3
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    # a request's own, larger limit is capped too; a smaller one stands
    r = capped.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=50)
    assert r.usage.completion_tokens <= 3
    r = capped.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=1)
    assert r.usage.completion_tokens == 1
    bad = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0,
                        default_headers={"x-clawgym-max-tokens": "lots"})
    with pytest.raises(openai.BadRequestError, match="x-clawgym-max-tokens must be an integer >= 1, got 'lots'"):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
