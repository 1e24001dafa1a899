"""Tool-call parsers chosen per model: each form parsed from the real tiny tokenizer's decoded output,
through the real proxy and the official anthropic and openai SDKs, streaming and not; detection from
the chat template; `--tool-parser` and `[engine] tool_parser`; an unparseable call stays text."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anthropic
import openai
import pytest

from clawgym.run.recipe import load_recipe, recipe_to_toml
from clawgym.errors import UserError
from clawgym.models.tiny import CHAT_TEMPLATE
from clawgym.proxy import ProxyConfig, ProxyThread
from clawgym.proxy.toolparse import PARSERS, choose, detect

from test_proxy_sdk import assert_token_prefix_property
from helpers import CHECK_HI, make_task, script

# --- the three forms, as a model writes them --------------------------------------------------


def hermes(text: str, calls: list[tuple[str, dict]]) -> str:
    blocks = [f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls]
    return "\n".join(([text] if text else []) + blocks)


def json_list(text: str, calls: list[tuple[str, dict]]) -> str:
    block = "<tool_call>" + json.dumps([{"name": n, "arguments": a} for n, a in calls]) + "</tool_call>"
    return f"{text}\n{block}" if text else block


def llama3(text: str, calls: list[tuple[str, dict]]) -> str:
    body = "<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    return f"{text} {body}" if text else body


WRITE = {"hermes": hermes, "json-list": json_list, "llama3-json": llama3}
# A call the model botched: bad JSON, arguments that are no object, or cut off by the token limit.
BAD = {
    "hermes": '<tool_call>\n{"name": "Bash", "arguments": {"command": }\n</tool_call>',
    "json-list": '<tool_call>[{"name": "Bash", "arguments": "ls -l"}]</tool_call>',
    "llama3-json": '<|python_tag|>{"name": "Bash", "parameters": {"command": "ls"}',
}
TWO = [("Bash", {"command": "ls"}), ("Read", {"path": "a.txt"})]
ONE = [("Bash", {"command": "cat a.txt"})]


@pytest.mark.parametrize("form", list(WRITE))
def test_each_form_parses_and_a_botched_call_stays_text(form: str) -> None:
    p = PARSERS[form]
    r = p.parse(WRITE[form]("Let me look.", TWO))
    assert r.text == "Let me look." and [(c.name, c.arguments) for c in r.tool_calls] == TWO
    r = p.parse(WRITE[form]("", ONE))
    assert r.text == "" and [(c.name, c.arguments) for c in r.tool_calls] == ONE
    assert p.parse(BAD[form]).tool_calls == [] and p.parse(BAD[form]).text == BAD[form]
    assert p.parse("Just an answer.").text == "Just an answer." and not p.parse("Just an answer.").tool_calls
    # The forms are disjoint: no other parser reads this form's calls (what makes detection unambiguous).
    for other in set(WRITE) - {form}:
        assert PARSERS[other].parse(WRITE[form]("x", ONE)).tool_calls == []


def test_llama3_details() -> None:
    p = PARSERS["llama3-json"]
    r = p.parse('{"name": "a", "arguments": "{\\"x\\": 1}"}\n{"name": "b", "parameters": {}}')  # no tag, no ';'
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("a", {"x": 1}), ("b", {})] and r.text == ""
    # a second call that is no call: the whole turn is text, nothing is half-parsed
    text = '{"name": "a", "parameters": {}}; {"nom": "b"}'
    assert p.parse(text).tool_calls == [] and p.parse(text).text == text
    # without the tag a call must be the whole turn: JSON inside prose is prose
    text = 'Use {"name": "a", "parameters": {}} like this.'
    assert p.parse(text).tool_calls == [] and p.parse(text).text == text
    r = p.parse('<|python_tag|>{"name": "a", "parameters": {"s": "}{;"}}\nDone.')
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("a", {"s": "}{;"})] and r.text == "Done."


def test_json_list_keeps_think_and_several_blocks() -> None:
    r = PARSERS["json-list"].parse("<think>plan</think>Ok.\n" + json_list("", TWO) + "\n" + json_list("", ONE))
    assert r.reasoning == "plan" and r.text == "Ok." and [(c.name, c.arguments) for c in r.tool_calls] == TWO + ONE
    assert PARSERS["json-list"].parse("<tool_call>[]</tool_call>").tool_calls == []


# --- templates: the tiny model's, rewritten to write calls in each form --------------------------

def _calls_part(template: str) -> str:
    """The part of the tiny template that writes an assistant turn's tool calls (Hermes blocks)."""
    start = template.index("{%- if message.tool_calls -%}")
    end = template.index("{%- endif -%}", template.index("{%- endfor -%}", start)) + len("{%- endif -%}")
    return template[start:end]


_CALLS_HERMES = _calls_part(CHAT_TEMPLATE)


def _calls(open_: str, sep: str, close: str, key: str, lead: str) -> str:
    return ("{%- if message.tool_calls -%}{%- if text -%}{{- '" + lead + "' -}}{%- endif -%}{{- '" + open_ + "' -}}"
            "{%- for tool_call in message.tool_calls -%}"
            "{%- set fn = tool_call.function if tool_call.function is defined else tool_call -%}"
            "{%- if not loop.first -%}{{- '" + sep + "' -}}{%- endif -%}"
            "{{- '{\"name\": \"' + fn.name + '\", \"" + key + "\": ' -}}"
            "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
            "{{- '}' -}}{%- endfor -%}{{- '" + close + "' -}}{%- endif -%}")


TEMPLATES = {
    "hermes": CHAT_TEMPLATE,
    "json-list": CHAT_TEMPLATE.replace(_CALLS_HERMES, _calls("<tool_call>[", ", ", "]</tool_call>", "arguments", "\\n")),
    "llama3-json": CHAT_TEMPLATE.replace(_CALLS_HERMES, _calls("<|python_tag|>", "; ", "", "parameters", " ")),
}
# Written in Llama 3.1's conventions (headers, <|eot_id|>, a call as the bare JSON of the turn).
LLAMA_HEADERS = """{{- bos_token -}}
{%- for m in messages -%}
{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' -}}
{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}
{{- '{"name": "' + c.function.name + '", "parameters": ' + (c.function.arguments | tojson) + '}' -}}
{%- endfor -%}{%- else -%}{{- m.content -}}{%- endif -%}
{{- '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"""
# SmolLM2's own template: plain ChatML that drops tools and tool calls.
CHATML_NO_TOOLS = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _render(tokenizer, template: str):
    return lambda m, t, g: tokenizer.apply_chat_template(m, tools=t or None, tokenize=False, add_generation_prompt=g,
                                                         chat_template=template)


def test_variant_templates_really_changed() -> None:
    assert "<tool_call>" in _CALLS_HERMES and "tojson" in _CALLS_HERMES
    assert TEMPLATES["json-list"] != CHAT_TEMPLATE and TEMPLATES["llama3-json"] != CHAT_TEMPLATE


@pytest.mark.parametrize("template,expected,why", [
    (TEMPLATES["hermes"], "hermes", "detected"),
    (TEMPLATES["json-list"], "json-list", "detected"),
    (TEMPLATES["llama3-json"], "llama3-json", "detected"),
    (LLAMA_HEADERS, "llama3-json", "detected"),
    (CHATML_NO_TOOLS, "hermes", "default: the chat template writes tool calls in no known form"),
    (CHAT_TEMPLATE.replace(_CALLS_HERMES, "{{ raise_exception('no tools here') }}"), "hermes",
     "default: the chat template could not render a tool call"),
    (CHAT_TEMPLATE.replace(_CALLS_HERMES, _CALLS_HERMES + _calls("<tool_call>[", ", ", "]</tool_call>", "arguments", "")),
     "hermes", "default: the chat template's tool calls read as hermes and json-list"),
], ids=["hermes", "json-list", "llama3-json", "llama-headers", "chatml-no-tools", "raises", "two-forms"])
def test_detect_from_the_template(tiny_tokenizer, template: str, expected: str, why: str) -> None:
    name, reason = detect(_render(tiny_tokenizer, template))
    assert name == expected and reason.startswith(why)
    # a name given explicitly wins over detection; a wrong one is a clear error
    assert choose("llama3-json", _render(tiny_tokenizer, template)) == ("llama3-json", "chosen with --tool-parser")
    with pytest.raises(UserError, match="unknown tool parser 'mistral'; choose one of: auto, hermes"):
        choose("mistral", _render(tiny_tokenizer, template))


# --- through the proxy and the SDKs ------------------------------------------------------------


@pytest.fixture(scope="module")
def form_models(tiny_model, tmp_path_factory) -> dict[str, Path]:
    """The tiny model with its template rewritten to each form (same tokenizer and weights)."""
    out = {}
    for form, template in TEMPLATES.items():
        d = tmp_path_factory.mktemp("models") / form
        shutil.copytree(tiny_model, d)
        (d / "chat_template.jinja").write_text(template)
        out[form] = d
    return out


@pytest.fixture(scope="module")
def proxies(form_models, tmp_path_factory):
    """One proxy per form, its parser left to auto-detection."""
    threads, out = [], {}
    try:
        for form, model in form_models.items():
            cfg = ProxyConfig(model_dir=model, engine="scripted", port=0, records_dir=tmp_path_factory.mktemp(f"rec-{form}"),
                              audit_render=True, ping_interval_s=0.05)
            t = ProxyThread(cfg).__enter__()
            threads.append(t)
            out[form] = t
        yield out
    finally:
        for t in threads:
            t.__exit__(None, None, None)


A_TOOLS = [{"name": n, "description": n, "input_schema": {"type": "object", "properties": {k: {"type": "string"}}}}
           for n, k in (("Bash", "command"), ("Read", "path"))]
O_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
           for t in A_TOOLS]
R_TOOLS = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]} for t in A_TOOLS]


def anthropic_turns(reg: dict, stream: bool, n: int) -> list[tuple[str, list, str]]:
    client = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
    messages: list[dict] = [{"role": "user", "content": "Look around."}]
    out = []
    for _ in range(n):
        kw = dict(model="m", max_tokens=256, tools=A_TOOLS, messages=messages)
        if stream:
            with client.messages.stream(**kw) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kw)
        uses = [b for b in msg.content if b.type == "tool_use"]
        out.append(("".join(b.text for b in msg.content if b.type == "text"), [(u.name, u.input) for u in uses],
                    {"tool_use": "tool", "end_turn": "stop"}[msg.stop_reason]))
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "ok"} for u in uses]
                         or "Go on."})
    return out


def chat_turns(reg: dict, stream: bool, n: int) -> list[tuple[str, list, str]]:
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    messages: list[dict] = [{"role": "user", "content": "Look around."}]
    out = []
    for _ in range(n):
        kw = dict(model="m", messages=messages, tools=O_TOOLS, max_completion_tokens=256)
        if stream:
            chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason][0]
        else:
            choice = client.chat.completions.create(**kw).choices[0]
            text, calls, finish = choice.message.content or "", choice.message.tool_calls or [], choice.finish_reason
        pairs = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
        out.append((text, pairs, {"tool_calls": "tool", "stop": "stop"}[finish]))
        messages.append({"role": "assistant", "content": text, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}} for c in calls]
            or None})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in calls] or [{"role": "user", "content": "Go on."}]
    return out


def responses_turns(reg: dict, stream: bool, n: int) -> list[tuple[str, list, str]]:
    client = openai.OpenAI(base_url=reg["openai_base_url"], api_key=reg["api_key"], max_retries=0)
    items: list[dict] = [{"type": "message", "role": "user", "content": "Look around."}]
    out = []
    for _ in range(n):
        kw = dict(model="m", input=items, tools=R_TOOLS, store=False)
        resp = list(client.responses.create(**kw, stream=True))[-1].response if stream else client.responses.create(**kw)
        calls = [o for o in resp.output if o.type == "function_call"]
        out.append((resp.output_text, [(c.name, json.loads(c.arguments)) for c in calls], "tool" if calls else "stop"))
        items += [o.model_dump(exclude_none=True) for o in resp.output]
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls] \
            or [{"type": "message", "role": "user", "content": "Go on."}]
    return out


DRIVERS = {"anthropic": anthropic_turns, "chat": chat_turns, "responses": responses_turns}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("protocol", list(DRIVERS))
@pytest.mark.parametrize("form", list(WRITE))
def test_form_through_proxy_and_sdk(proxies, form: str, protocol: str, stream: bool) -> None:
    proxy = proxies[form]
    health = proxy.admin("GET", "/admin/health")
    assert health["tool_parser"] == form and health["tool_parser_source"] == "detected from the chat template"
    rid = f"{form}-{protocol}-{'s' if stream else 'j'}"
    script = [WRITE[form]("Let me look.", TWO), WRITE[form]("", ONE), BAD[form]]
    reg = proxy.register(rid, script=script)
    turns = DRIVERS[protocol](reg, stream, len(script))
    assert turns[0] == ("Let me look.", TWO, "tool")
    assert turns[1] == ("", ONE, "tool")
    assert turns[2] == (BAD[form], [], "stop")  # the botched call reaches the harness as the text it was
    recs = assert_token_prefix_property(proxy, rid, len(script))
    assert [r.finish_reason for r in recs] == ["tool_calls", "tool_calls", "stop"]
    assert proxy.server.metrics.get("clawgym_proxy_render_audit_mismatch_total") == 0


# --- choosing it: serve-proxy, rollout, recipes -------------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "clawgym.cli", *args]


@pytest.mark.slow
def test_serve_proxy_names_the_parser_and_refuses_an_unknown_one(form_models, tmp_path: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    bad = subprocess.run(_cli("serve-proxy", "--model", str(form_models["hermes"]), "--port", "0", "--engine", "scripted",
                              "--tool-parser", "mistral"), capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 1 and "unknown tool parser 'mistral'" in bad.stderr and "Traceback" not in bad.stderr
    for args, line in ((["--model", str(form_models["json-list"])], "tool parser json-list: detected from the chat template"),
                       (["--model", str(form_models["hermes"]), "--tool-parser", "llama3-json"],
                        "tool parser llama3-json: chosen with --tool-parser")):
        proc = subprocess.Popen(_cli("serve-proxy", *args, "--port", "0", "--engine", "scripted", "--records", str(tmp_path)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            first = proc.stdout.readline()
        finally:
            proc.terminate()
            proc.wait(30)
        assert line in first, first + proc.stderr.read()


def test_recipe_engine_tool_parser(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    path = tmp_path / "r.toml"
    head = '[model]\ninit = "tiny"\n\n[rollout]\ntasks = "tasks"\n\n'
    path.write_text(head + '[engine]\nname = "hf"\ntool_parser = "json-list"\ndtype = "float32"\n')
    r = load_recipe(path)
    assert r.engine.tool_parser == "json-list" and r.engine.options == {"dtype": "float32"}  # not an engine option
    assert r.rollout_config(tmp_path / "step", 1, 0).tool_parser == "json-list"  # what the run's proxy is started with
    saved = tmp_path / "saved.toml"
    saved.write_text(recipe_to_toml(r))
    assert load_recipe(saved).engine.tool_parser == "json-list"
    path.write_text(head + '[engine]\ntool_parser = "mistral"\n')
    with pytest.raises(UserError, match=r"\[engine\] key 'tool_parser': unknown tool parser 'mistral'"):
        load_recipe(path)
    path.write_text(head + "[engine]\ntool_parser = 3\n")
    with pytest.raises(UserError, match=r"\[engine\] key 'tool_parser' must be str, got int"):
        load_recipe(path)
    path.write_text(head)
    assert load_recipe(path).engine.tool_parser == "auto" and "tool_parser =" not in recipe_to_toml(load_recipe(path))


@pytest.mark.slow
def test_rollout_serves_with_the_parser_it_is_given(tmp_path: Path, tiny_model: Path) -> None:
    """The same Llama-form answer: a tool call with --tool-parser llama3-json, plain text under auto (hermes)."""
    from clawgym.rollout.runner import RolloutConfig, run_rollouts

    make_task(tmp_path / "tasks", "hello", check=CHECK_HI)
    rewards = {}
    for parser in ("llama3-json", "auto"):
        s = script(tmp_path / f"{parser}.jsonl", {"hello.agentloop.0": [llama3("", [("write", {"path": "out.txt", "content": "hi"})]),
                                                                      "Done."]})
        cfg = RolloutConfig(tasks=tmp_path / "tasks", harnesses=["agentloop"], out=tmp_path / parser, model=tiny_model,
                            engine="scripted", engine_options={"script": str(s)}, tool_parser=parser)
        [rec] = run_rollouts(cfg).rollouts
        assert rec.status == "ok"
        rewards[parser] = (rec.reward, rec.n_calls)
    assert rewards == {"llama3-json": (1.0, 2), "auto": (0.0, 1)}
