"""Rendering + token-in-token-out: incremental equals a full render, sampled ids are spliced in however
the harness re-serializes a turn, history rewrites fall back to full renders, the tool-call parser."""

from __future__ import annotations

import json

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawgym.artifacts import CallRecord, delta_encode_calls, materialize_prompts
from clawgym.proxy import anthropic, openai_chat, read_records
from clawgym.proxy.render import Renderer, RolloutTito
from clawgym.proxy.toolparse import HermesParser
from clawgym.proxy.types import Message, ToolSpec

TOOLS = [ToolSpec("Bash", "run", {"type": "object", "properties": {"command": {"type": "string"}}}),
         ToolSpec("Read", "read", {"type": "object", "properties": {"path": {"type": "string"}}})]


@pytest.fixture(scope="module", params=["tiny", "no-think-gen"])
def renderer(request, tiny_model):
    """The tiny template, and a variant whose generation prompt adds an empty think block (as Qwen3
    does with thinking off) that the rendered history never shows."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    if request.param == "no-think-gen":
        old = "{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
        assert old in tok.chat_template
        tok.chat_template = tok.chat_template.replace(old, "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}")
    return Renderer(tok)


def sample(tok, text: str, eos: bool = True) -> list[int]:
    ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    return ids + [tok.eos_token_id] if eos else ids


def answer(tito: RolloutTito, tok, msgs, call_id: str, text: str, eos: bool = True):
    """Render, commit, 'sample' `text`, store it; returns (prompt ids, output ids, parsed turn)."""
    plan = tito.render(msgs, TOOLS)
    tito.commit(plan, call_id)
    out = sample(tok, text, eos)
    parsed = HermesParser().parse(tok.decode([t for t in out if t != tok.eos_token_id], skip_special_tokens=False))
    tito.add_completion(call_id, parsed.text, parsed.tool_calls, out)
    return plan, out, parsed


def call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def test_echo_variants_still_splice_the_sampled_ids(renderer, tiny_tokenizer):
    """Key order, whitespace, rewritten ids, split text blocks: the echo matches the completion."""
    tito = RolloutTito(renderer, audit=True)
    msgs = [Message("system", "sys"), Message("user", "go")]
    plan, out, parsed = answer(tito, tiny_tokenizer, msgs, "c0", "Let me look.\n" + call("Bash", command="ls", flag=True) + call("Read", path="a"))
    assert [c.name for c in parsed.tool_calls] == ["Bash", "Read"] and parsed.text == "Let me look."
    # Anthropic echo: text split into two blocks, input keys reordered, ids rewritten.
    echo = anthropic.parse({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me "}, {"type": "text", "text": "look. "},
                                          {"type": "tool_use", "id": "x", "name": "Bash", "input": {"flag": True, "command": "ls"}},
                                          {"type": "tool_use", "id": "y", "name": "Read", "input": {"path": "a"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "a b"},
                                     {"type": "tool_result", "tool_use_id": "y", "content": "text of a"}]}], "system": "sys"})
    p2 = tito.render(echo.messages, TOOLS)
    assert p2.mode == "incremental" and p2.spliced == 1 and p2.unmatched == 0 and not p2.audit_mismatch
    assert p2.prompt_ids[: len(plan.prompt_ids) + len(out)] == plan.prompt_ids + out
    assert p2.base_call == "c0" and p2.base_len == len(plan.prompt_ids) + len(out)
    # The same turn echoed as OpenAI chat, arguments a JSON string with other spacing and ids without '_'.
    chat = openai_chat.parse({"model": "m", "messages": [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "callx", "type": "function", "function": {"name": "Bash", "arguments": '{"flag":true,  "command":"ls"}'}},
            {"id": "cally", "type": "function", "function": {"name": "Read", "arguments": '{"path": "a"}'}}]},
        {"role": "tool", "tool_call_id": "callx", "content": "a b"}, {"role": "tool", "tool_call_id": "cally", "content": "text of a"}]})
    p3 = tito.render(chat.messages, TOOLS)
    assert p3.prompt_ids == p2.prompt_ids
    # A harness that drops the text before its tool calls still gets the sampled ids.
    chat.messages[2].content = ""
    p4 = tito.render(chat.messages, TOOLS)
    assert p4.spliced == 1 and p4.prompt_ids == p2.prompt_ids


def test_truncated_output_and_unmatched_turns(renderer, tiny_tokenizer):
    tito = RolloutTito(renderer, audit=True)
    msgs = [Message("user", "write a lot")]
    plan, out, parsed = answer(tito, tiny_tokenizer, msgs, "c0", "a long answer that was cut", eos=False)
    assert out[-1] != tiny_tokenizer.eos_token_id
    msgs = msgs + [Message("assistant", parsed.text), Message("user", "continue")]
    p2 = tito.render(msgs, TOOLS)
    assert p2.spliced == 1 and p2.prompt_ids[: len(plan.prompt_ids) + len(out)] == plan.prompt_ids + out
    assert p2.prompt_ids[len(plan.prompt_ids) + len(out)] == tiny_tokenizer.eos_token_id  # the template's end of turn
    # An assistant turn the proxy never produced is rendered from its text and counted.
    fake = msgs + [Message("assistant", "I made this up"), Message("user", "ok")]
    p3 = tito.render(fake, TOOLS)
    assert p3.unmatched == 1 and p3.spliced == 1


def test_history_rewrite_falls_back_to_full_render(renderer, tiny_tokenizer):
    tito = RolloutTito(renderer, audit=True)
    msgs = [Message("system", "sys"), Message("user", "task")]
    for i in range(3):
        plan, out, parsed = answer(tito, tiny_tokenizer, msgs, f"c{i}", call("Bash", command=f"echo {i}"))
        msgs = msgs + [Message("assistant", parsed.text, parsed.tool_calls), Message("tool", f"out {i}")]
        assert plan.mode == ("full" if i == 0 else "incremental") and not plan.fallback
    compacted = [Message("system", "sys"), Message("user", "Summary of the work so far: ran 3 commands.")]
    p = tito.render(compacted, TOOLS)
    assert p.mode == "full" and p.fallback
    # OpenClaw-style: a trailing context message moves behind each new turn, so no earlier request
    # is a prefix: a full render, yet the assistant turn still gets its sampled ids.
    tito = RolloutTito(renderer, audit=True)
    ctx = Message("user", "<context>")
    plan, out, parsed = answer(tito, tiny_tokenizer, [Message("system", "sys"), Message("user", "task"), ctx], "c0",
                               call("exec", command="echo hi"))
    moved = [Message("system", "sys"), Message("user", "task"), Message("assistant", parsed.text, parsed.tool_calls),
             Message("tool", "(no output)"), ctx]
    p = tito.render(moved, TOOLS)
    assert p.mode == "full" and p.fallback and p.spliced == 1 and p.unmatched == 0
    assert any(p.prompt_ids[i:i + len(out)] == out for i in range(len(p.prompt_ids)))  # sampled ids, verbatim
    assert p.base_call == "c0" and p.base_len >= 16  # still delta-encoded against the shared prefix


def test_the_proxy_stores_each_prompt_by_the_codec_rule(renderer, tiny_tokenizer):
    """What the renderer decides a record stores (base call, shared tokens) is what the codec's
    offline encoder gives the same full prompts: an agent loop, the same request again, a subagent
    in between (another system prompt), a compacted history and a trailing context message moved."""
    tito = RolloutTito(renderer, audit=True)
    plans, full = [], []

    def turn(msgs, text):
        cid = f"c{len(plans)}"
        plan, out, parsed = answer(tito, tiny_tokenizer, msgs, cid, text)
        plans.append(plan)
        full.append(CallRecord("r", cid, len(full), "openai-chat", "m", 0.0, 0.0, list(plan.prompt_ids), out,
                               [0.0] * len(out), "stop", 0))
        return Message("assistant", parsed.text, parsed.tool_calls)

    main = [Message("system", "You are a coding agent. Inspect files with Bash before answering."), Message("user", "task")]
    sub = [Message("system", "You search the code base."), Message("user", "find foo")]
    for i in range(3):
        main = main + [turn(main, call("Bash", command=f"cat f{i}")), Message("tool", f"contents of f{i}")]
    turn(main, call("Bash", command="ls"))
    sub = sub + [turn(sub, "Searching."), Message("user", "go on")]  # another system prompt: stored in full
    turn(sub, "Found it.")
    main = main + [turn(main, call("Bash", command="grep foo")), Message("tool", "a.txt")]  # the same request again
    turn(main, "Summary: four files read.")
    compacted = main[:2] + [Message("user", "Summary: four files read.")]  # a full render, against the latest call
    compacted = compacted + [turn(compacted, call("Bash", command="cat a.txt")), Message("tool", "foo")]
    turn(compacted + [Message("user", "<context 1>")], call("Bash", command="pwd"))
    turn(compacted + [Message("assistant", "checking"), Message("user", "<context 2>")], "Done.")  # the latest call shares most
    ctx = Message("user", "<context>")  # moved behind each new turn: no earlier request is a prefix
    aux = [Message("system", "You title conversations."), Message("user", "Title this.")]
    a = turn(aux + [ctx], call("Bash", command="date"))
    turn(aux + [a, Message("tool", "Tuesday"), ctx], "A title.")

    encoded = delta_encode_calls(full)
    assert [(p.base_call, p.base_len) for p in plans] == [(c.prompt_base_call, c.prompt_base_len) for c in encoded]
    assert {p.mode for p in plans if p.base_call} == {"incremental", "full"}  # both render paths store deltas
    stored = [p.delta.tail(p.prompt_ids) for p in plans]
    assert stored == [c.prompt_ids for c in encoded]
    assert [c.prompt_ids for c in materialize_prompts(encoded)] == [p.prompt_ids for p in plans]


def test_retry_of_identical_request_gives_identical_prompt(renderer, tiny_tokenizer):
    tito = RolloutTito(renderer)
    msgs = [Message("user", "hi")]
    plan, _, _ = answer(tito, tiny_tokenizer, msgs, "c0", "hello")
    again = tito.render(msgs, TOOLS)
    assert again.prompt_ids == plan.prompt_ids and again.mode == "incremental"


PROXY = {"audit_render": True}
"""the module's proxy (conftest `proxy`)"""


def same_call(i: int, variant: str) -> str:
    """The same `exec ls` call each turn, differing only in JSON spacing or only in the reasoning."""
    if variant == "spacing":
        return "<tool_call>\n" + '{"name": "exec", "arguments": {"command":' + " " * i + '"ls"}}' + "\n</tool_call>"
    return f"<think>\nattempt {i}: look again\n</think>\n\n" + call("exec", command="ls")


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["spacing", "reasoning"])
@pytest.mark.parametrize("pattern", ["append", "drop-context"])
def test_repeated_tool_call_keeps_each_turns_sampled_ids(proxy, tiny_tokenizer, pattern, variant):
    """The model makes the same call three times; the harness echoes all three identically (OpenClaw:
    reasoning dropped, ids rewritten). Appending: each prompt extends the previous prompt + its sampled
    ids. OpenClaw's pattern (a trailing context message replaced every turn): each prompt extends the
    previous prompt without its context message + its sampled ids. Either way, turn k holds turn k's ids."""
    rid = f"repeat-{pattern}-{variant}"
    n = 3
    reg = proxy.register(rid, script=[same_call(i, variant) for i in range(n)] + ["Done."])
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    tools = [{"type": "function", "function": {"name": "exec", "description": "run",
                                               "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    history: list[dict] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "List the files."}]
    ctx = [f"<context turn {i}>" for i in range(n + 1)]
    for i in range(n + 1):
        extra = [{"role": "user", "content": ctx[i]}] if pattern == "drop-context" else []
        msg = client.chat.completions.create(model="tiny", messages=history + extra, tools=tools).choices[0].message
        if i == n:
            assert msg.content == "Done."
            break
        assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [("exec", {"command": "ls"})]
        assert (getattr(msg, "reasoning_content", None) is not None) == (variant == "reasoning")
        calls = [{"id": c.id.replace("_", ""), "type": "function", "function": {"name": "exec", "arguments": '{"command": "ls"}'}}
                 for c in msg.tool_calls]
        history += [{"role": "assistant", "content": msg.content or "", "tool_calls": calls},
                    {"role": "tool", "tool_call_id": calls[0]["id"], "content": "a.txt b.txt"}]
    proxy.settle(rid)
    recs = materialize_prompts(read_records(proxy.config.records_dir / f"{rid}.jsonl"))
    assert len(recs) == n + 1
    assert len({tuple(r.output_ids) for r in recs[:n]}) == n  # three different samples of one canonical turn
    gen = tiny_tokenizer.backend_tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False).ids
    for i, (prev, cur) in enumerate(zip(recs, recs[1:])):
        base = prev.prompt_ids
        if pattern == "drop-context":  # cut the context message: the prompt ends with it + the generation prompt
            block = tiny_tokenizer.apply_chat_template([{"role": "user", "content": ctx[i]}], tokenize=False)
            cut = len(tiny_tokenizer.backend_tokenizer.encode(block, add_special_tokens=False).ids)
            assert base[-len(gen):] == gen and tiny_tokenizer.decode(base[-len(gen) - cut: -len(gen)]) == block
            base = base[: -len(gen) - cut] + gen
        seq = base + prev.output_ids
        assert cur.prompt_ids[: len(seq)] == seq, f"call {cur.seq} diverges at token {next(j for j, (a, b) in enumerate(zip(seq, cur.prompt_ids)) if a != b)} of {len(seq)}"
        assert cur.render_mode == ("incremental" if pattern == "append" else "full")
    assert proxy.server.metrics.get("clawgym_proxy_render_audit_mismatch_total") == 0
    assert proxy.server.metrics.get("clawgym_proxy_tito_unmatched_turns_total") == 0


TURN = st.sampled_from(["tool", "tools2", "text_user", "user_only", "system_mid"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(TURN, min_size=1, max_size=8), lead_system=st.booleans(), with_tools=st.booleans())
def test_incremental_equals_full_render_and_prompts_extend(renderer, tiny_tokenizer, turns, lead_system, with_tools):
    tito = RolloutTito(renderer, audit=True)
    tools = TOOLS if with_tools else []
    msgs = ([Message("system", "be brief")] if lead_system else []) + [Message("user", "start")]
    prev: list[int] | None = None
    for i, kind in enumerate(turns):
        plan = tito.render(msgs, tools)
        assert not plan.audit_mismatch
        if prev is not None and kind != "system_mid":
            assert plan.prompt_ids[: len(prev)] == prev
        tito.commit(plan, f"c{i}")
        text = {"tool": f"ok {i}\n" + call("Bash", command=f"c{i}"), "tools2": call("Bash", command="a") + call("Read", path=f"p{i}"),
                "text_user": f"Answer  {i}.", "user_only": f"Answer {i}", "system_mid": f"x{i}"}[kind]
        out = sample(tiny_tokenizer, text)
        parsed = HermesParser().parse(tiny_tokenizer.decode(out[:-1], skip_special_tokens=False))
        tito.add_completion(f"c{i}", parsed.text, parsed.tool_calls, out)
        prev = plan.prompt_ids + out
        msgs = msgs + [Message("assistant", parsed.text + " ", parsed.tool_calls)]
        if kind in ("tool", "tools2"):
            msgs += [Message("tool", f"result {i}.{j}") for j in range(len(parsed.tool_calls))]
        elif kind == "system_mid":
            msgs += [Message("system", "reminder"), Message("user", "more")]
        else:
            msgs += [Message("user", f"next {i}")]
    final = tito.render(msgs, tools)
    assert not final.audit_mismatch and final.prompt_ids[: len(prev)] == prev


def test_hermes_parser_cases():
    p = HermesParser()
    r = p.parse("<think>plan it</think>Sure.\n" + call("Bash", command="ls") + "\n" + call("Read", path="x"))
    assert r.reasoning == "plan it" and r.text == "Sure." and [c.arguments for c in r.tool_calls] == [{"command": "ls"}, {"path": "x"}]
    bad = "Here: <tool_call>\n{not json}\n</tool_call>"
    assert p.parse(bad).tool_calls == [] and p.parse(bad).text == bad  # unparseable -> text, never an error
    assert p.parse('<tool_call>{"name": "X", "arguments": [1]}</tool_call>').tool_calls == []
    cut = "Start <tool_call>\n{\"name\": \"Bash\", \"argu"
    assert p.parse(cut).text == cut and not p.parse(cut).tool_calls
    s = p.parse('<tool_call>{"name": "Bash", "arguments": "{\\"command\\": \\"pwd\\"}"}</tool_call>')
    assert s.tool_calls[0].arguments == {"command": "pwd"}  # arguments given as a JSON string
    assert p.parse("plain text").text == "plain text"
