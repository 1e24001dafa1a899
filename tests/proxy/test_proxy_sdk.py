"""The proxy driven by the official anthropic and openai SDKs: multi-turn tool use, streaming and not,
asserting on the SDKs' parsed objects and, on the records, that every prompt extends the previous
prompt plus its sampled output token for token (token-in-token-out)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from clawgym.artifacts import materialize_prompts, read_table, CallRecord
from clawgym.proxy import export_calls, read_records

TURNS = 10


def tool_text(i: int, name: str = "Bash", key: str = "command") -> str:
    return f'Step {i}: running it.\n<tool_call>\n{{"name": "{name}", "arguments": {{"{key}": "echo {i} > f{i}.txt"}}}}\n</tool_call>'


PROXY = {"audit_render": True, "ping_interval_s": 0.05}
"""the module's proxy (conftest `proxy`)"""


def assert_token_prefix_property(proxy, rollout_id: str, n: int) -> list[CallRecord]:
    assert proxy.settle(rollout_id)["calls_recorded"] == n
    raw = read_records(proxy.config.records_dir / f"{rollout_id}.jsonl")
    recs = materialize_prompts(raw)
    assert [r.seq for r in recs] == list(range(n))
    assert all(r.status == "ok" for r in recs)
    for prev, cur, stored in zip(recs, recs[1:], raw[1:]):
        seq = prev.prompt_ids + prev.output_ids
        assert cur.prompt_ids[: len(seq)] == seq, f"call {cur.seq} does not extend call {prev.seq} + its output"
        assert len(cur.prompt_ids) > len(seq)
        assert cur.render_mode == "incremental"
        # stored delta-encoded against the call it extends: only the new tokens are on disk
        assert stored.prompt_base_call == prev.call_id and stored.prompt_base_len == len(seq)
    return recs


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_ten_tool_turns(proxy, tiny_tokenizer, stream):
    rid = f"anth-{'s' if stream else 'j'}"
    script = [tool_text(i) for i in range(TURNS)] + ["All files written."]
    reg = proxy.register(rid, script=script)
    client = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    tools = [{"name": "Bash", "description": "Run a shell command", "cache_control": {"type": "ephemeral"},
              "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
    messages: list[dict] = [{"role": "user", "content": "Write ten files."},
                            # Claude Code sends a system turn inside messages (mid-conversation-system beta).
                            {"role": "system", "content": "Available agent types: none."}]
    system = [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}]
    extra = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}, "metadata": {"user_id": "u"},
             "context_management": {"edits": []}}
    for i in range(TURNS + 1):
        kwargs = dict(model="claude-sonnet-4-6", max_tokens=512, system=system, tools=tools, messages=messages, extra_body=extra)
        if stream:
            with client.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        if i < TURNS:
            assert msg.stop_reason == "tool_use"
            text = [b for b in msg.content if b.type == "text"]
            uses = [b for b in msg.content if b.type == "tool_use"]
            assert [t.text for t in text] == [f"Step {i}: running it."]
            assert len(uses) == 1 and uses[0].name == "Bash" and uses[0].input == {"command": f"echo {i} > f{i}.txt"}
            assert uses[0].id.startswith("toolu_")
            # Echo the way Claude Code does: blocks re-serialized, plus a tool_result with cache_control.
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                          "content": f"(Bash completed with no output) {i}", "is_error": False,
                                                          "cache_control": {"type": "ephemeral"}}]})
        else:
            assert msg.stop_reason == "end_turn"
            assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "All files written."
        assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0
    recs = assert_token_prefix_property(proxy, rid, TURNS + 1)
    assert all(r.protocol == "anthropic" and r.stream == stream and r.tool_names == ["Bash"] for r in recs)
    assert tiny_tokenizer.decode(recs[-1].output_ids, skip_special_tokens=True) == "All files written."
    assert recs[0].output_logprobs == [0.0] * len(recs[0].output_ids)
    assert proxy.server.metrics.get("clawgym_proxy_render_audit_mismatch_total") == 0


@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_ten_tool_turns(proxy, stream):
    rid = f"chat-{'s' if stream else 'j'}"
    # Two calls in one turn, every few turns: parallel tool calls must parse and round-trip too.
    script = [tool_text(i, "exec") + ("\n" + tool_text(100 + i, "exec").split("\n", 1)[1] if i % 3 == 0 else "")
              for i in range(TURNS)] + ["Done: wrote the files."]
    reg = proxy.register(rid, script=script)
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    tools = [{"type": "function", "function": {"name": "exec", "description": "Run a command",
                                               "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages: list[dict] = [{"role": "system", "content": "You are an assistant."}, {"role": "user", "content": "Write files."}]
    for i in range(TURNS + 1):
        kwargs = dict(model="mock-model", messages=messages, tools=tools, tool_choice="auto", max_completion_tokens=512)
        if stream:
            chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
            assert chunks[0].choices[0].delta.role == "assistant"
            assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][0]
            calls = [{"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments} for tc in calls]
        else:
            r = client.chat.completions.create(**kwargs)
            msg, finish = r.choices[0].message, r.choices[0].finish_reason
            content = msg.content or ""
            calls = [{"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments} for tc in msg.tool_calls or []]
        if i < TURNS:
            assert finish == "tool_calls"
            assert content == f"Step {i}: running it."
            expected = [i] + ([100 + i] if i % 3 == 0 else [])
            assert [json.loads(c["arguments"]) for c in calls] == [{"command": f"echo {k} > f{k}.txt"} for k in expected]
            # OpenClaw strips '_' from ids and re-serializes arguments; the proxy must still match the turn.
            echoed = [{"id": c["id"].replace("_", ""), "type": "function",
                       "function": {"name": c["name"], "arguments": json.dumps(json.loads(c["arguments"]), indent=1)}}
                      for c in calls]
            messages.append({"role": "assistant", "content": content, "tool_calls": echoed})
            for c in echoed:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": f"(no output) {i}"})
        else:
            assert finish == "stop" and content == "Done: wrote the files." and not calls
    recs = assert_token_prefix_property(proxy, rid, TURNS + 1)
    assert {r.finish_reason for r in recs[:-1]} == {"tool_calls"} and recs[-1].finish_reason == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_openai_responses_tool_turns(proxy, stream):
    rid = f"resp-{'s' if stream else 'j'}"
    patch = "*** Begin Patch\n*** Add File: out.txt\n+hi\n*** End Patch\n"
    script = [tool_text(0, "exec_command", "cmd"),
              '<tool_call>\n{"name": "apply_patch", "arguments": {"input": ' + json.dumps(patch) + '}}\n</tool_call>',
              '<tool_call>\n{"name": "multi_agent_v1.spawn", "arguments": {"task": "x"}}\n</tool_call>',
              "Finished."]
    reg = proxy.register(rid, script=script)
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    tools = [{"type": "function", "name": "exec_command", "description": "Run", "strict": False,
              "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
             {"type": "custom", "name": "apply_patch", "description": "Patch files",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
             {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
              "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]},
             {"type": "web_search"}]
    items: list[dict] = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Base instructions."}]},
                         {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Skills."}]},
                         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Create out.txt"}]}]
    expect = ["function_call", "custom_tool_call", "function_call", "message"]
    for i in range(4):
        kwargs = dict(model="mock-model", input=items, tools=tools, store=False, tool_choice="auto", parallel_tool_calls=True,
                      include=["reasoning.encrypted_content"], reasoning={"summary": "auto"}, extra_body={"prompt_cache_key": "k"})
        if stream:
            events = list(client.responses.create(**kwargs, stream=True))
            assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
            assert events[-1].type == "response.completed"
            assert [e.sequence_number for e in events] == list(range(len(events)))
            resp = events[-1].response
        else:
            resp = client.responses.create(**kwargs)
        out = [o for o in resp.output if o.type != "message" or expect[i] == "message"]
        assert out[-1].type == expect[i]
        assert resp.usage.input_tokens > 0
        if i == 0:
            call = out[-1]
            assert call.name == "exec_command" and json.loads(call.arguments) == {"cmd": "echo 0 > f0.txt"}
            items += [o.model_dump(exclude_none=True) for o in resp.output]
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "Process exited with code 0"})
        elif i == 1:
            call = out[-1]
            assert call.name == "apply_patch" and call.input == patch
            items.append({"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": call.input})
            items.append({"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success."})
        elif i == 2:
            call = out[-1]
            assert call.name == "spawn" and getattr(call, "namespace", None) == "multi_agent_v1"
            items.append(call.model_dump(exclude_none=True))
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "spawned"})
        else:
            assert resp.output_text == "Finished."
    assert_token_prefix_property(proxy, rid, 4)


def test_export_calls_parquet(proxy, tmp_path):
    reg = proxy.register("export-me", script=["hello there"])
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    proxy.settle("export-me")
    n = export_calls(proxy.config.records_dir, tmp_path / "calls.parquet")
    rows = read_table(tmp_path / "calls.parquet", CallRecord)
    assert n == len(rows) and any(r.rollout_id == "export-me" for r in rows)
    assert all(r.prompt_base_call is None for r in rows)  # expanded to full prompts
    mine = [r for r in rows if r.rollout_id == "export-me"][0]
    assert mine.protocol == "openai-chat" and mine.output_ids and mine.policy_version == 0


def test_count_tokens_and_model_lists(proxy):
    reg = proxy.register("counting", script=["short answer"])
    a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    kw = dict(model="m", system="sys", messages=[{"role": "user", "content": "how many tokens is this?"}])
    n = a.messages.count_tokens(**kw).input_tokens
    msg = a.messages.create(max_tokens=20, **kw)
    assert n == msg.usage.input_tokens > 0
    assert proxy.settle("counting")["calls_recorded"] == 1  # counting is not a call
    assert [m.id for m in a.models.list()] == [proxy.server.model_name]
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    assert [m.id for m in o.models.list()] == [proxy.server.model_name]


def test_stop_sequences_cut_the_turn_and_the_record(proxy, tiny_tokenizer):
    reg = proxy.register("stops", script=["alpha beta STOP gamma delta", "one two three"])
    a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    msg = a.messages.create(model="m", max_tokens=50, stop_sequences=["STOP", "zzz"], messages=[{"role": "user", "content": "go"}])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == "STOP" and msg.content[0].text == "alpha beta "
    o = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    r = o.chat.completions.create(model="m", stop="two", messages=[{"role": "user", "content": "go"}])
    assert r.choices[0].message.content == "one " and r.choices[0].finish_reason == "stop"
    proxy.settle("stops")
    first, second = read_records(proxy.config.records_dir / "stops.jsonl")
    kept = tiny_tokenizer.decode(first.output_ids)
    assert "STOP" in kept and "delta" not in kept and first.finish_reason == "stop"
    assert len(first.output_logprobs) == len(first.output_ids)


def test_claude_code_billing_fingerprint_is_normalized_and_recorded_as_sent(proxy, tiny_tokenizer):
    """Claude Code's first system line carries a per-run fingerprint (cc_version=2.1.197.XXX): two
    runs of one task must tokenize to the same prompt, and each record keeps the line as it came."""
    prompts, sent = [], []
    for rid, fp in (("bill-a", "38b"), ("bill-b", "920")):
        reg = proxy.register(rid, script=["ok"])
        a = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
        system = [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.{fp}; cc_entrypoint=sdk-cli;"},
                  {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}]
        a.messages.create(model="m", max_tokens=20, system=system, messages=[{"role": "user", "content": "go"}])
        proxy.settle(rid)
        (rec,) = read_records(proxy.config.records_dir / f"{rid}.jsonl")
        prompts.append(rec.prompt_ids)
        sent.append(json.loads(rec.normalized_json))
    assert prompts[0] == prompts[1]
    text = tiny_tokenizer.decode(prompts[0])
    assert "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=sdk-cli;You are a Claude agent." in text
    assert sent == [{"billing_header": f"x-anthropic-billing-header: cc_version=2.1.197.{fp}"} for fp in ("38b", "920")]
    # a system prompt without the line is left alone and records nothing
    reg = proxy.register("bill-none", script=["ok"])
    anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0).messages.create(
        model="m", max_tokens=20, system="cc_version=2.1.197.38b", messages=[{"role": "user", "content": "go"}])
    proxy.settle("bill-none")
    (rec,) = read_records(proxy.config.records_dir / "bill-none.jsonl")
    assert rec.normalized_json == "{}" and "cc_version=2.1.197.38b" in tiny_tokenizer.decode(rec.prompt_ids)
