"""Harness adapters without a model: agentloop's tools, each adapter's launch, outcome reading and call roles."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clawgym.rollout.harnesses import HARNESSES, Endpoint
from clawgym.rollout.harnesses.agentloop import run_tool
from clawgym.rollout.harnesses.base import classify_by_tools
from helpers import model_with_template, template_fixture

EP = Endpoint(base_url="http://127.0.0.1:9/r/abc", api_key="sk-rollout-key", model="policy")


@pytest.fixture
def in_workspace(tmp_path: Path):
    old = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)


def test_agentloop_tools_act_in_the_workspace(in_workspace: Path) -> None:
    assert run_tool("write", {"path": "a/b.txt", "content": "hello"}) == "wrote 5 characters to a/b.txt"
    assert (in_workspace / "a/b.txt").read_text() == "hello"
    assert run_tool("read", {"path": "a/b.txt"}) == "hello"
    assert run_tool("edit", {"path": "a/b.txt", "old": "ll", "new": "LL"}) == "edited a/b.txt"
    assert (in_workspace / "a/b.txt").read_text() == "heLLo"
    assert run_tool("edit", {"path": "a/b.txt", "old": "zz", "new": ""}).startswith("error: the text to replace was not found")
    out = run_tool("bash", {"command": "echo hi > out.txt && cat out.txt && exit 3"})
    assert out == "exit code 3\nhi\n" and (in_workspace / "out.txt").read_text() == "hi\n"
    assert run_tool("python", {"code": "print(6*7)"}) == "exit code 0\n42\n"


def test_agentloop_tool_errors_are_text_for_the_model(in_workspace: Path) -> None:
    assert run_tool("read", {"path": "../../etc/passwd"}).startswith("error: path '../../etc/passwd' is outside the workspace")
    assert run_tool("write", {"path": "/tmp/x", "content": ""}).startswith("error: path '/tmp/x' is outside")
    assert run_tool("bash", {}) == "error: missing argument 'command' for tool bash"
    assert run_tool("fly", {}).startswith("error: unknown tool 'fly'; available: bash, read, write, edit, python")
    assert run_tool("read", {"path": "missing.txt"}).startswith("error: [Errno 2]")
    assert run_tool("bash", {"command": "sleep 5"}, timeout=0.2) == "error: bash timed out after 0 s"
    big = run_tool("python", {"code": "print('x' * 10000)"})
    assert len(big) < 4200 and "characters cut" in big


def test_every_adapter_points_the_harness_at_the_rollout_url_and_key(tmp_path: Path) -> None:
    for name, make in HARNESSES.items():
        h = make()
        launch = h.launch("Write hi to out.txt", tmp_path / "ws", tmp_path / "home", EP)
        blob = json.dumps(launch.argv) + json.dumps(launch.env) + json.dumps(launch.files)
        assert "http://127.0.0.1:9/r/abc" in blob, name
        assert "sk-rollout-key" in blob, name
        assert "Write hi to out.txt" in launch.argv, name
        assert h.protocol in ("anthropic", "openai-chat", "openai-responses")


def test_quiet_settings_of_the_real_harnesses(tmp_path: Path) -> None:
    cc = HARNESSES["claude-code"]().launch("x", tmp_path, tmp_path, EP)
    assert cc.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and cc.env["IS_SANDBOX"] == "1"
    assert {"-p", "--verbose", "--dangerously-skip-permissions"} <= set(cc.argv)
    assert cc.argv[cc.argv.index("--output-format") + 1] == "stream-json"
    codex = HARNESSES["codex"]().launch("x", tmp_path, tmp_path / "home", EP)
    config = codex.files[".codex/config.toml"]
    assert 'wire_api = "responses"' in config and 'base_url = "http://127.0.0.1:9/r/abc/v1"' in config
    assert "plugins = false" in config and codex.env["CODEX_HOME"] == str(tmp_path / "home" / ".codex")
    oc = HARNESSES["openclaw"]().launch("x", tmp_path, tmp_path / "home", EP)
    cfg = json.loads(oc.files["openclaw.json5"])
    assert cfg["models"]["providers"]["clawgym"]["baseUrl"] == "http://127.0.0.1:9/r/abc/v1"


def test_claude_code_and_codex_limits_for_a_slow_engine(tmp_path: Path) -> None:
    import tomllib

    from clawgym.errors import UserError

    cc = HARNESSES["claude-code"]().launch("x", tmp_path, tmp_path, EP)
    # the stream watchdog's 300 s and the 600 s request limit raised to request_timeout; no output cap
    assert cc.env["API_TIMEOUT_MS"] == cc.env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "1800000"
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in cc.env
    cc = HARNESSES["claude-code"](max_tokens=48, request_timeout=90).launch("x", tmp_path, tmp_path, EP)
    assert cc.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "48" and cc.env["API_TIMEOUT_MS"] == "90000"
    plain = tomllib.loads(HARNESSES["codex"]().launch("x", tmp_path, tmp_path, EP).files[".codex/config.toml"])
    assert "http_headers" not in plain["model_providers"]["clawgym"]
    capped = tomllib.loads(HARNESSES["codex"](max_tokens=48, idle_timeout_s=1800).launch("x", tmp_path, tmp_path, EP).files[".codex/config.toml"])
    provider = capped["model_providers"]["clawgym"]
    assert provider["http_headers"] == {"x-clawgym-max-tokens": "48"} and provider["stream_idle_timeout_ms"] == 1_800_000
    for name, bad, message in (("claude-code", {"max_tokens": 0}, "claude-code option 'max_tokens' must be an integer >= 1, got 0"),
                               ("claude-code", {"request_timeout": "slow"}, "claude-code option 'request_timeout' must be a number > 0"),
                               ("codex", {"max_tokens": 1.5}, "codex option 'max_tokens' must be an integer >= 1"),
                               ("codex", {"idle_timeout_s": 0}, "codex option 'idle_timeout_s' must be an integer >= 1")):
        with pytest.raises(UserError, match=message):
            HARNESSES[name](**bad)


def test_codex_slim_config(tmp_path: Path) -> None:
    import tomllib

    from clawgym.errors import UserError

    home, ws = tmp_path / "home", tmp_path / "ws"
    plain = HARNESSES["codex"]().launch("x", ws, home, EP).files
    assert set(plain) == {".codex/config.toml"}
    plain_config = tomllib.loads(plain[".codex/config.toml"])
    launch = HARNESSES["codex"](slim=True, max_tokens=48).launch("x", ws, home, EP)
    slim = tomllib.loads(launch.files[".codex/config.toml"])
    # the built-in instructions replaced by a one-line file in Codex's own home, the workspace named in it
    assert slim["model_instructions_file"] == str(home / ".codex" / "instructions.md")
    assert launch.files[".codex/instructions.md"] == f"CWD: {ws}\n" and launch.env["CODEX_HOME"] == str(home / ".codex")
    assert (slim["include_permissions_instructions"], slim["include_environment_context"]) == (False, False)
    assert slim["skills"] == {"include_instructions": False}
    assert slim["features"] == plain_config["features"] | {"view_image": False}
    assert slim["tools"] == {"experimental_request_user_input": {"enabled": False}}
    # the rest is the plain config: the same provider (with the max_tokens header), approvals and limits
    rest = {k: v for k, v in slim.items() if k not in ("model_instructions_file", "include_permissions_instructions",
                                                       "include_environment_context", "skills", "features", "tools")}
    assert rest["model_providers"]["clawgym"]["http_headers"] == {"x-clawgym-max-tokens": "48"}
    rest["model_providers"]["clawgym"].pop("http_headers")
    assert rest == {k: v for k, v in plain_config.items() if k != "features"}
    with pytest.raises(UserError, match="codex option 'slim' must be true or false, got 'yes'"):
        HARNESSES["codex"](slim="yes")


def test_openclaw_slim_config(tmp_path: Path) -> None:
    from clawgym.errors import UserError

    def config(**options) -> dict:
        return json.loads(HARNESSES["openclaw"](**options).launch("x", tmp_path, tmp_path / "home", EP).files["openclaw.json5"])

    plain = config()  # OpenClaw's own tools, skills, workspace files and memory
    assert set(plain) == {"agents", "models"} and set(plain["agents"]["defaults"]) == {"model"}
    slim = config(slim=True)
    # a shell and the file tools, each with its schema (no deferred catalog), apply_patch not added by `write`
    assert slim["tools"] == {"allow": ["exec", "read", "write", "edit"], "toolSearch": False, "deny": ["apply_patch"]}
    assert slim["agents"]["defaults"] == {"model": plain["agents"]["defaults"]["model"], "skills": [], "contextInjection": "never"}
    assert slim["plugins"] == {"enabled": False} and slim["models"] == plain["models"]  # no plugins, memory's among them
    assert config(slim=True, tools="exec, write")["tools"]["allow"] == ["exec", "write"]
    # `tools` alone narrows the tools and leaves the rest as OpenClaw has it; naming apply_patch keeps it
    only = config(tools="exec,write,apply_patch")
    assert only["tools"] == {"allow": ["exec", "write", "apply_patch"], "toolSearch": False} and "plugins" not in only
    for bad, message in (({"tools": ""}, "openclaw option 'tools' must be comma-separated tool names"),
                         ({"tools": "exec;rm -rf"}, "openclaw option 'tools' must be comma-separated tool names"),
                         ({"tools": ["exec"]}, "openclaw option 'tools' must be comma-separated tool names"),
                         ({"slim": "yes"}, "openclaw option 'slim' must be true or false"),
                         ({"context_window": 0}, "openclaw option 'context_window' must be an integer >= 1")):
        with pytest.raises(UserError, match=message):
            HARNESSES["openclaw"](**bad)


def test_outcomes_are_read_from_exit_code_and_output() -> None:
    al = HARNESSES["agentloop"]()
    assert al.outcome(0, "", "").status == "ok"
    assert al.outcome(0, '{"event": "turn"}\n{"event": "done", "final": "42 apples"}\n', "").final_message == "42 apples"
    assert al.outcome(4, "", "model endpoint failed: Connection error.").status == "infra_error"
    assert al.outcome(1, "", "Traceback...\nKeyError: x").status == "harness_error"

    cc = HARNESSES["claude-code"]()
    ok = json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "Done"})
    assert cc.outcome(0, '{"type":"system"}\n' + ok, "").final_message == "Done"
    not_logged_in = json.dumps({"type": "result", "is_error": True, "result": "Not logged in · Please run /login"})
    bad = cc.outcome(1, not_logged_in, "")
    assert bad.status == "harness_error" and "Not logged in" in bad.message
    retry = json.dumps({"type": "system", "subtype": "api_retry"})
    assert cc.outcome(1, retry + "\n" + not_logged_in, "").status == "infra_error"
    # answers that kept hitting max_tokens (SmolLM2 with claude-code.max_tokens=48): the policy's doing, scored
    long = json.dumps({"type": "result", "subtype": "success", "is_error": True,
                       "result": "API Error: Claude's response exceeded the 48 output token maximum. To configure this behavior, "
                                 "set the CLAUDE_CODE_MAX_OUTPUT_TOKENS environment variable."})
    cut = cc.outcome(1, long, "")
    assert cut.status == "harness_error" and "exceeded the 48 output token maximum" in cut.message

    codex = HARNESSES["codex"]()
    done = '{"type":"item.completed","item":{"type":"agent_message","text":"All set"}}\n{"type":"turn.completed","usage":{}}'
    assert codex.outcome(0, done, "").final_message == "All set"
    failed = codex.outcome(1, '{"type":"turn.failed","error":{"message":"stream disconnected before completion"}}', "")
    assert failed.status == "infra_error"

    oc = HARNESSES["openclaw"]()
    assert oc.outcome(0, '{"ok":true,"status":"ok","final":"Done"}', "").final_message == "Done"
    # `--json` pretty-prints over many lines, after whatever else was printed
    pretty = json.dumps({"ok": True, "final": "Done", "toolSummary": {"tools": ["exec"]}}, indent=2)
    assert oc.outcome(0, "starting\n" + pretty + "\n", "") == oc.outcome(0, pretty, "")
    assert (oc.outcome(0, pretty, "").status, oc.outcome(0, pretty, "").final_message) == ("ok", "Done")
    assert al.outcome(139, "", "").message == "exit code 139 (killed by SIGSEGV)"
    assert oc.outcome(1, '{"ok":false,"error":"fetch failed ECONNREFUSED"}', "").status == "infra_error"


def test_call_roles() -> None:
    main_tools = ["bash", "read", "write"]
    assert classify_by_tools(main_tools, main_tools) == "main"
    assert classify_by_tools(["read"], main_tools) == "subagent"
    assert classify_by_tools([], main_tools) == "aux"
    al = HARNESSES["agentloop"]()
    assert al.classify([], "Your context is nearly full. Summarize", main_tools) == "compaction"
    assert al.classify(main_tools, "Write hi", main_tools) == "main"
    cc = HARNESSES["claude-code"]()
    # Claude Code 2.1.197's title request: its instructions are the system prompt, the user message is this.
    title = ("<session>\nfix the bug\n</session>\n\nWrite the title in the language the user wrote in, regardless of the "
             "language of the examples above.")
    assert cc.classify(["Bash"], title, ["Bash"]) == "aux"  # by its text, whatever tools it carries
    assert cc.classify(["Bash"], "Generate a concise, sentence-case title for my post", ["Bash"]) == "main"  # a task's words
    assert cc.classify(["Bash", "Read"], "Your task is to create a detailed summary of the conversation", ["Bash", "Read"]) == "compaction"
    assert cc.classify(["Bash", "Read"], "fix the bug", ["Bash", "Read"]) == "main"


def test_runner_classifies_against_the_first_call_with_tools() -> None:
    # A harness may make a call without tools (a title) before its main agent's first turn.
    from clawgym.artifacts import CallRecord
    from clawgym.rollout.runner import _classify

    def call(seq: int, tools: list[str]) -> CallRecord:
        return CallRecord(rollout_id="r", call_id=f"c{seq}", seq=seq, protocol="anthropic", model="m", started_at=0.0,
                          finished_at=0.0, prompt_ids=[1], output_ids=[2], output_logprobs=[0.0], finish_reason="stop",
                          policy_version=0, tool_names=tools)

    calls = [call(0, []), call(1, ["Bash", "Read"]), call(2, ["Read"]), call(3, ["Bash", "Read"])]
    roles = [c.role for c in _classify(calls, {"r": HARNESSES["claude-code"]()}, {})]  # no conversation log: tools alone
    assert roles == ["aux", "main", "subagent", "main"]
    # the roles read from the proxy's conversation log win; a call missing from it falls back to its tools
    logged = {"r": {"0": "aux", "1": "main", "2": "subagent", "3": "compaction"}}
    assert [c.role for c in _classify(calls, {"r": HARNESSES["claude-code"]()}, logged)] == ["aux", "main", "subagent", "compaction"]
    logged["r"].pop("3")
    assert [c.role for c in _classify(calls, {"r": HARNESSES["claude-code"]()}, logged)] == ["aux", "main", "subagent", "main"]


def test_roles_come_from_the_conversation_the_proxy_parsed_under_any_template(tiny_model: Path, tmp_path: Path) -> None:
    """Claude Code's title and compaction requests, sent with the anthropic SDK to a proxy whose model
    has Llama 3.2's template (not ChatML): the adapter reads each call's last user message from the
    proxy's conversation log (decoding ChatML found none here), so the title call is `aux`, the
    compaction `compaction`, and the agent's own calls `main`."""
    import anthropic

    from clawgym.proxy import ProxyConfig, ProxyThread
    from clawgym.rollout.harnesses.base import call_roles

    model = model_with_template(tiny_model, tmp_path / "llama", template_fixture("llama3.2.jinja"), llama=True)
    config = ProxyConfig(model_dir=model, engine="scripted", port=0, records_dir=tmp_path / "records")
    tools = [{"name": "Bash", "description": "Run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    title = "<session>\nfix the bug\n</session>\n\nWrite the title in the language the user wrote in."
    with ProxyThread(config) as proxy:
        reg = proxy.register("cc", script=["A title", "Looking.", "Still looking.", "Summary: looked."])
        client = anthropic.Anthropic(base_url=reg["base_url"], api_key=reg["api_key"], max_retries=0)
        turns = [([], [{"role": "user", "content": title}]),
                 (tools, [{"role": "user", "content": "fix the bug"}]),
                 (tools, [{"role": "user", "content": "fix the bug"}, {"role": "assistant", "content": "Looking."},
                          {"role": "user", "content": "go on"}]),
                 (tools, [{"role": "user", "content": "fix the bug"}, {"role": "assistant", "content": "Looking."},
                          {"role": "user", "content": "Your task is to create a detailed summary of the conversation so far."}])]
        for t, messages in turns:
            client.messages.create(model="m", max_tokens=8, messages=messages, **({"tools": t} if t else {}))
        log = proxy.client.conversation("cc")
    assert [c["last_user"] for c in log] == [title, "fix the bug", "go on", turns[3][1][-1]["content"]]
    assert call_roles(HARNESSES["claude-code"](), log) == {0: "aux", 1: "main", 2: "main", 3: "compaction"}


def test_real_harnesses_say_how_to_install_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAWGYM_HOME", str(tmp_path))
    for name in ("claude-code", "codex", "openclaw"):
        reason = HARNESSES[name]().missing()
        assert reason is not None and f"clawgym harness install {name}" in reason
    assert HARNESSES["agentloop"]().missing() is None
