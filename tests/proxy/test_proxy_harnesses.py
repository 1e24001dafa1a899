"""Real harnesses against the proxy (scripted engine): `claude -p` and `codex exec` each run one shell
tool call that writes a file, then finish; the records hold both calls, and the second prompt extends
the first prompt plus its sampled tokens.

The binaries come from `scripts/install-harnesses.sh` (`clawgym harness install`: pinned npm versions); without
them these tests skip and say how to install. Every harness runs exactly as its adapter launches it
in a rollout (argv, environment, config files: the quiet environment docs/harnesses.md describes), with a
fresh HOME and an HTTP(S) proxy that refuses everything, so nothing but the proxy on 127.0.0.1 is
reachable.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from clawgym.artifacts import materialize_prompts
from clawgym.proxy import ProxyThread, read_records
from clawgym.rollout.harnesses.base import Endpoint
from clawgym.rollout.harnesses.claude_code import ClaudeCode
from clawgym.rollout.harnesses.codex import Codex
from clawgym.rollout.harnesses.base import call_roles

pytestmark = [pytest.mark.harness, pytest.mark.slow]

BINARIES = {"claude": ClaudeCode().binary, "codex": Codex().binary}  # where `clawgym harness install` puts them
DEAD_PROXY = "http://127.0.0.1:9"  # discard port: any attempt to reach an outside host fails at once
PROMPT = "Create a file out.txt containing hi by running a shell command."


def need(binary: str) -> Path:
    path = BINARIES[binary]()
    if not path.exists():
        pytest.skip(f"{binary} is not installed: run scripts/install-harnesses.sh (pinned versions into {path.parents[2]})")
    return path


# Harness prompts (20-40k tokens with the tiny tokenizer) exceed the tiny model's window; the
# scripted engine does not care, so the window is lifted here.
PROXY = {"max_context": 1 << 20, "audit_render": True, "ping_interval_s": 0.1}
"""the module's proxy (conftest `proxy`)"""


def base_env(home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TERM": "dumb", "LANG": "C.UTF-8",
            "SHELL": "/bin/bash", "HTTP_PROXY": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY, "http_proxy": DEAD_PROXY,
            "https_proxy": DEAD_PROXY, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def assert_two_calls_extend(proxy: ProxyThread, rollout_id: str, protocol: str) -> None:
    st = proxy.settle(rollout_id, timeout=60)
    recs = materialize_prompts(read_records(proxy.config.records_dir / f"{rollout_id}.jsonl"))
    assert len(recs) == st["calls_recorded"] == 2, [r.status for r in recs]
    first, second = recs
    assert all(r.status == "ok" and r.protocol == protocol and r.stream for r in recs)
    seq = first.prompt_ids + first.output_ids
    assert second.prompt_ids[: len(seq)] == seq and len(second.prompt_ids) > len(seq)
    assert second.render_mode == "incremental"


def run_adapter(harness, reg: dict, tmp_path: Path, unset: tuple[str, ...] = (), **extra_env: str) -> tuple[Path, subprocess.CompletedProcess]:
    """The harness exactly as its adapter launches it in a rollout (argv, env, config files), run
    directly in a fresh workspace with a fresh HOME instead of a sandbox; `unset` drops variables."""
    ws, home = tmp_path / "ws", tmp_path / "home"
    ws.mkdir()
    launch = harness.launch(PROMPT, ws, home, Endpoint(base_url=reg["base_url"], api_key=reg["api_key"]))
    launch.write_files(home)
    env = {k: v for k, v in (base_env(home) | launch.env | extra_env).items() if k not in unset}
    run = subprocess.run(launch.argv, cwd=ws, env=env, capture_output=True, text=True, timeout=180)
    return ws, run


def test_claude_code_writes_a_file_through_the_proxy(proxy, tmp_path):
    need("claude")
    # The first answer is slow, so Claude Code also sees keep-alive pings before the content.
    script = [{"text": '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo hi > out.txt", "description": "write out.txt"}}\n</tool_call>',
               "delay_s": 0.5},
              "Done: wrote out.txt"]
    reg = proxy.register("claude-code", script=script)
    # The full Claude Code (not --bare, all its tools): its real 20-40k-token prompts.
    ws, run = run_adapter(ClaudeCode(max_turns=5, bare=False, tools=""), reg, tmp_path, CLAUDE_CODE_MAX_RETRIES="0")
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    result = [x for x in lines if x.get("type") == "result"]
    assert run.returncode == 0 and result and not result[-1]["is_error"], (run.stdout[-2000:], run.stderr[-2000:])
    assert result[-1]["result"] == "Done: wrote out.txt"
    assert (ws / "out.txt").read_text().strip() == "hi"
    assert_two_calls_extend(proxy, "claude-code", "anthropic")


def test_claude_code_slim_default_offers_the_documented_tools(proxy, tmp_path):
    """The adapter's defaults (a one-line system prompt, `--tools Bash,Read,Write,Edit,Glob,Grep`):
    the recorded requests offer exactly those six tools, and a `Write` call writes the file."""
    need("claude")
    harness = ClaudeCode(max_turns=5)
    target = tmp_path / "ws" / "out.txt"  # Write takes an absolute path
    script = ['<tool_call>\n' + json.dumps({"name": "Write", "arguments": {"file_path": str(target), "content": "hi\n"}})
              + '\n</tool_call>', "Done: wrote out.txt"]
    reg = proxy.register("claude-code-slim", script=script)
    ws, run = run_adapter(harness, reg, tmp_path, CLAUDE_CODE_MAX_RETRIES="0")
    result = [x for x in map(json.loads, (x for x in run.stdout.splitlines() if x.startswith("{"))) if x.get("type") == "result"]
    assert run.returncode == 0 and result and not result[-1]["is_error"], (run.stdout[-2000:], run.stderr[-2000:])
    assert "No such tool available" not in run.stdout and target.read_text() == "hi\n"
    assert_two_calls_extend(proxy, "claude-code-slim", "anthropic")
    recs = read_records(proxy.config.records_dir / "claude-code-slim.jsonl")
    assert [sorted(r.tool_names) for r in recs] == [sorted(harness.tools.split(","))] * 2
    assert recs[0].prompt_base_call is None and len(recs[0].prompt_ids) < 8000  # still slim: mostly the six tools


def test_claude_code_title_call_is_classified_aux_by_its_prompt(proxy, tmp_path):
    """With nonessential traffic on, Claude Code 2.1.197 first asks for a session title. The adapter
    recognizes the real request by its text (not only by carrying no tools), and the task's own
    calls stay the main agent's."""
    need("claude")
    harness = ClaudeCode(max_turns=5)
    reg = proxy.register("claude-code-title", script=['{"title": "Create out file"}', "Done: nothing to do"])
    ws, run = run_adapter(harness, reg, tmp_path, unset=("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",), CLAUDE_CODE_MAX_RETRIES="0")
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    proxy.settle("claude-code-title", timeout=60)
    log = proxy.client.conversation("claude-code-title")
    assert sorted(bool(c["tools"]) for c in log) == [False, True], [c["tools"] for c in log]
    title_call, task_call = sorted(log, key=lambda c: bool(c["tools"]))
    title, task = title_call["last_user"], task_call["last_user"]
    assert PROMPT in title and PROMPT in task
    main_tools = task_call["tools"]
    assert harness.classify(main_tools, title, main_tools) == "aux"  # the prompt alone says so
    assert harness.classify([], title, main_tools) == "aux" and harness.classify(main_tools, task, main_tools) == "main"
    assert sorted(call_roles(harness, log).values()) == ["aux", "main"]


def test_codex_writes_a_file_through_the_proxy(proxy, tmp_path):
    need("codex")
    script = [{"text": '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo hi > out.txt"}}\n</tool_call>',
               "delay_s": 0.5},
              "Done: wrote out.txt"]
    reg = proxy.register("codex", script=script)
    ws, run = run_adapter(Codex(context_window=128000, retries=0, idle_timeout_s=120), reg, tmp_path)
    events = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"]
    assert messages == ["Done: wrote out.txt"], run.stdout[-2000:]
    assert (ws / "out.txt").read_text().strip() == "hi"
    assert_two_calls_extend(proxy, "codex", "openai-responses")
