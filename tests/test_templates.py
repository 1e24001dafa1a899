"""Chat templates: the tool-use check on real templates (Qwen3, Llama 3.2, SmolLM2), the proxy refusing a
template without tools and accepting --chat-template, and token-in-token-out through the real proxy with
Qwen3's template, which drops earlier reasoning from a fresh render, and with Llama 3.2's.

The real templates are fixtures (tests/fixtures/templates/README.md names their sources). They run with
the tiny model's tokenizer, given the special tokens a template needs where it is not ChatML."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from clawgym.artifacts import materialize_prompts
from clawgym.errors import UserError
from clawgym.proxy import ProxyConfig, ProxyThread, read_records
from clawgym.proxy.server import ProxyServer
from clawgym.models.templates import SHIPPED, assistant_completion, load_chat_template, shipped_template, tool_use_problems
from helpers import model_with_template, template_fixture

TOOLS = [{"type": "function", "function": {"name": "exec", "description": "Run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]

@pytest.mark.parametrize("name, problems", [
    ("qwen3.jinja", []),
    ("llama3.2.jinja", []),
    ("smollm2.jinja", ["the tools offered are not rendered", "an assistant turn's tool calls are not rendered"]),
])
def test_tool_use_check_on_real_templates(tiny_tokenizer, name, problems) -> None:
    tok = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tok.chat_template = template_fixture(name)
    assert tool_use_problems(tok) == problems


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_templates_render_tool_use(tiny_tokenizer, name) -> None:
    tok = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tok.chat_template = shipped_template(name)
    assert tool_use_problems(tok) == []
    del tok.chat_template
    assert tool_use_problems(tok) == ["the tokenizer has no chat template"]


def test_smollm2_tools_renders_what_smollm2_renders_without_tools(tiny_tokenizer) -> None:
    """The shipped SmolLM2 template only adds tools: plain chats render as the model's own template does."""
    convos = [
        [{"role": "user", "content": "What is 2+3?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
         {"role": "user", "content": "bye"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
    ]
    for convo in convos:
        for gen in (True, False):
            original = tiny_tokenizer.apply_chat_template(convo, chat_template=template_fixture("smollm2.jinja"), tokenize=False, add_generation_prompt=gen)
            ours = tiny_tokenizer.apply_chat_template(convo, chat_template=shipped_template("smollm2-tools"), tokenize=False, add_generation_prompt=gen)
            assert ours == original
    with_tools = tiny_tokenizer.apply_chat_template(convos[0], tools=TOOLS, chat_template=shipped_template("smollm2-tools"), tokenize=False)
    assert with_tools.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n# Tools")
    call = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "exec", "arguments": {"command": "ls"}}},
                                                                {"type": "function", "function": {"name": "exec", "arguments": '{"command": "pwd"}'}}]}]
    text = tiny_tokenizer.apply_chat_template(convos[0] + call, chat_template=shipped_template("smollm2-tools"), tokenize=False)
    assert '<|im_start|>assistant\n<tool_call>[{"name": "exec", "arguments": {"command": "ls"}}, {"name": "exec", "arguments": {"command": "pwd"}}]</tool_call><|im_end|>' in text


def test_assistant_completion_is_what_the_model_generates_in_its_templates_call_form(tiny_tokenizer) -> None:
    """The teacher's answer: the template's assistant turn after the generation prompt, through its end marker."""
    tok = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    one, two = [("bash", {"command": "ls"})], [("bash", {"command": "ls"}), ("write", {"path": "a"})]
    tok.chat_template = shipped_template("chatml-tools")
    assert assistant_completion(tok, "", one) == '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
    assert assistant_completion(tok, "done", []) == "done<|im_end|>"
    tok.chat_template = shipped_template("smollm2-tools")
    assert assistant_completion(tok, "", one) == '<tool_call>[{"name": "bash", "arguments": {"command": "ls"}}]</tool_call><|im_end|>'
    assert assistant_completion(tok, "hi", two) == ('hi\n<tool_call>[{"name": "bash", "arguments": {"command": "ls"}}, '
                                                   '{"name": "write", "arguments": {"path": "a"}}]</tool_call><|im_end|>')
    tok.chat_template = template_fixture("qwen3.jinja")  # thinking on: the turn shows its (empty) think block
    assert assistant_completion(tok, "done", []) == "<think>\n\n</think>\n\ndone<|im_end|>"
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="renders no assistant turn after its generation prompt"):
        assistant_completion(tok, "done", [])
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(ValueError, match="has no end-of-turn marker"):
        assistant_completion(tok, "done", [])


def test_load_chat_template_errors(tmp_path) -> None:
    assert load_chat_template("chatml-tools") == shipped_template("chatml-tools")
    f = tmp_path / "t.jinja"
    f.write_text(template_fixture("qwen3.jinja"))
    assert load_chat_template(f) == template_fixture("qwen3.jinja")
    with pytest.raises(UserError, match="no such file, and not a shipped template"):
        load_chat_template(tmp_path / "missing.jinja")
    (tmp_path / "empty.jinja").write_text(" \n")
    with pytest.raises(UserError, match="the file is empty"):
        load_chat_template(tmp_path / "empty.jinja")


@pytest.mark.slow
def test_proxy_refuses_a_template_without_tools_then_serves_with_chat_template(tiny_model, tmp_path) -> None:
    model = model_with_template(tiny_model, tmp_path / "smol-template", template_fixture("smollm2.jinja"))
    with pytest.raises(UserError, match=r"tools offered are not rendered.*--chat-template FILE"):
        ProxyServer(ProxyConfig(model_dir=model, engine="scripted", port=0, records_dir=tmp_path / "r0"))
    # The command line: one line on stderr, exit 1, no traceback.
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "serve-proxy", "--model", str(model), "--engine", "scripted",
                        "--port", "0", "--records", str(tmp_path / "r1")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--chat-template FILE" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    # Accepted with the shipped ChatML tool template; a multi-turn tool conversation is prefix-exact.
    config = ProxyConfig(model_dir=model, engine="scripted", port=0, records_dir=tmp_path / "r2", audit_render=True,
                         chat_template="chatml-tools")
    script = [f'<tool_call>\n{{"name": "exec", "arguments": {{"command": "echo {i}"}}}}\n</tool_call>' for i in range(3)] + ["Done."]
    with ProxyThread(config) as proxy:
        messages = converse(client_for(proxy, "chatml", script), [{"role": "user", "content": "Run three commands."}], len(script))
        assert messages[-1] == {"role": "assistant", "content": "Done."}
        recs = prompts_extend(proxy, "chatml", len(script))
    text = proxy.server.tokenizer.decode(recs[-1].prompt_ids)
    assert "# Tools" in text and '"command": "echo 2"' in text and "<tool_response>\nout 2\n</tool_response>" in text


def client_for(proxy, rid: str, script: list[str]) -> openai.OpenAI:
    reg = proxy.register(rid, script=script)
    return openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)


def converse(client: openai.OpenAI, messages: list[dict], turns: int, tools: list[dict] = TOOLS) -> list[dict]:
    """`turns` model calls with the openai SDK, echoing each turn and answering each tool call."""
    for i in range(turns):
        msg = client.chat.completions.create(model="m", messages=messages, tools=tools, max_completion_tokens=256).choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in msg.tool_calls or []]
        messages.append({"role": "assistant", "content": msg.content or ""} | ({"tool_calls": calls} if calls else {}))
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"out {i}"} for c in calls]
    return messages


def prompts_extend(proxy, rid: str, n: int):
    """Every recorded prompt extends the previous prompt + its sampled ids, token for token, and was
    rendered incrementally (the proxy's audit also rendered each fully and found them equal)."""
    assert proxy.settle(rid)["calls_recorded"] == n
    recs = materialize_prompts(read_records(proxy.config.records_dir / f"{rid}.jsonl"))
    assert [r.status for r in recs] == ["ok"] * n
    for prev, cur in zip(recs, recs[1:]):
        seq = prev.prompt_ids + prev.output_ids
        assert cur.prompt_ids[: len(seq)] == seq, f"call {cur.seq} does not extend call {prev.seq} + its output"
        assert cur.render_mode == "incremental"
    metrics = proxy.server.metrics
    assert metrics.get("clawgym_proxy_render_audit_mismatch_total") == 0 and metrics.get("clawgym_proxy_render_fallback_total") == 0
    return recs


def test_qwen3_template_drops_reasoning_but_prompts_still_extend(tiny_model, tmp_path) -> None:
    """Qwen3's template drops the <think> of turns before the last user query; TITO keeps the sampled ids."""
    model = model_with_template(tiny_model, tmp_path / "qwen3", template_fixture("qwen3.jinja"))
    config = ProxyConfig(model_dir=model, engine="scripted", port=0, records_dir=tmp_path / "r", audit_render=True)
    call = '<tool_call>\n{{"name": "exec", "arguments": {{"command": "echo {}"}}}}\n</tool_call>'
    script = ["<think>\nplan one\n</think>\n\n" + call.format(1), "<think>\nplan two\n</think>\n\nDone with one.",
              "<think>\nplan three\n</think>\n\n" + call.format(3), "<think>\nplan four\n</think>\n\nDone with three."]
    with ProxyThread(config) as proxy:
        tok = proxy.server.tokenizer
        client = client_for(proxy, "q3", script)
        messages = converse(client, [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "First task."}], 2)
        assert messages[-1] == {"role": "assistant", "content": "Done with one."}
        # A second user query: a fresh render of the history (reasoning echoed inline) drops it now ...
        messages.append({"role": "user", "content": "Second task."})
        echoed = [m | {"content": "<think>\nplan two\n</think>\n\n" + m["content"]} if m.get("content") == "Done with one." else m
                  for m in messages]
        assert "plan two" in tok.apply_chat_template(echoed[:-1], tools=TOOLS, tokenize=False)
        assert "plan two" not in tok.apply_chat_template(echoed, tools=TOOLS, tokenize=False, add_generation_prompt=True)
        # ... but the proxy keeps what the model sampled, so every prompt extends the one before.
        converse(client, messages, 2)
        recs = prompts_extend(proxy, "q3", 4)
    last = tok.decode(recs[-1].prompt_ids)
    assert "plan one" in last and "plan two" in last and "plan three" in last
    assert last.count("<|im_start|>user") == 4  # two queries and two tool results


def test_llama3_template_tool_conversation_prompts_extend(tiny_model, tmp_path) -> None:
    """Llama 3.2's template (tools in the first user message, results under `ipython`): accepted at
    start, and a multi-turn conversation is prefix-exact. The hermes parser does not read Llama's
    JSON calls, so the model's turns are text and the harness brings tool results as user turns."""
    model = model_with_template(tiny_model, tmp_path / "llama", template_fixture("llama3.2.jinja"), llama=True)
    config = ProxyConfig(model_dir=model, engine="scripted", port=0, records_dir=tmp_path / "r", audit_render=True)
    with ProxyThread(config) as proxy:
        tok = proxy.server.tokenizer
        assert proxy.server.renderer.eos_text == "<|eot_id|>" and tok.convert_tokens_to_ids("<|eot_id|>") in proxy.server.renderer.stop_ids
        client = client_for(proxy, "l3", [f"Answer {i}." for i in range(4)])
        messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List the files."}]
        for i in range(4):
            converse(client, messages, 1)
            messages.append({"role": "user", "content": f"Next question {i}."})
        recs = prompts_extend(proxy, "l3", 4)
    last = tok.decode(recs[-1].prompt_ids)
    assert "Given the following functions" in last and '"name": "exec"' in last
    assert last.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_recipe_engine_chat_template(tmp_path) -> None:
    from clawgym.run.recipe import load_recipe, recipe_to_toml

    (tmp_path / "tasks").mkdir()
    (tmp_path / "t.jinja").write_text(template_fixture("qwen3.jinja"))

    def recipe(value: str):
        path = tmp_path / "r.toml"
        path.write_text(f'[model]\ninit = "tiny"\n[rollout]\ntasks = "tasks"\n[engine]\nname = "hf"\nchat_template = "{value}"\nmax_batch = 4\n')
        return load_recipe(path)

    r = recipe("t.jinja")
    assert r.engine.chat_template == str(tmp_path / "t.jinja") and r.engine.options == {"max_batch": 4}
    assert f'chat_template = "{tmp_path / "t.jinja"}"' in recipe_to_toml(r)
    assert recipe("smollm2-tools").engine.chat_template == "smollm2-tools"
    with pytest.raises(UserError, match=r"\[engine\] key 'chat_template': .*missing.jinja: no such file"):
        recipe("missing.jinja")
