"""`openclaw`: the OpenClaw agent (`openclaw agent exec`), unmodified, against the proxy's Chat Completions route.

From driving the real program (docs/harnesses.md, "openclaw"): OpenClaw needs Node ≥ 24 (under
Node 20 npm silently installs an empty 0.0.1 placeholder), so we install Node 24 from npm next to
it. `agent exec` is its headless entry point; a per-run JSON5 config points a custom provider at
the proxy. It rewrites tool-call ids (drops `_`), which the proxy's matching tolerates. Start-up is
slow (tens of seconds and over a gigabyte of RSS on a small machine): give it a generous timeout.
"""

from __future__ import annotations

import json
from pathlib import Path

from clawgym.artifacts import Transcript
from clawgym.rollout.harnesses import npm
from clawgym.rollout.harnesses.base import Endpoint, Launch, Outcome, classify_by_tools, exit_text
from clawgym.rollout.transcript import from_proxy

VERSION = "2026.9.6"
PACKAGE = f"openclaw@{VERSION}"
_COMPACTION_MARKERS = ("summarize the conversation", "compaction summary", "<summary>")


class OpenClaw(npm.NpmHarness):
    """Runs `openclaw.mjs` on its own Node 24, so `install` and `missing` cover both."""

    name = "openclaw"
    protocol = "openai-chat"
    package, bin_name, title = PACKAGE, "openclaw", f"OpenClaw {VERSION} (with Node 24)"

    def __init__(self, context_window: int = 32768, max_tokens: int = 4096, timeout_s: int = 600):
        self.context_window, self.max_tokens, self.timeout_s = context_window, max_tokens, timeout_s

    def entry(self) -> Path:
        return self.folder / "node_modules" / "openclaw" / "openclaw.mjs"

    def install(self) -> Path:
        node_bin = npm.node24_bin()
        npm.npm_install(self.folder, [PACKAGE], node_bin=node_bin)
        return self.entry()

    def missing(self) -> str | None:
        if not (npm.node24_dir() / "node").exists() or not self.entry().exists():
            return f"{self.title} is not installed (run: clawgym harness install {self.name})"
        return None

    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        config = {
            "agents": {"defaults": {"model": {"primary": f"clawgym/{endpoint.model}"}}},
            "models": {"mode": "replace", "providers": {"clawgym": {
                "baseUrl": endpoint.base_url.rstrip("/") + "/v1", "apiKey": endpoint.api_key, "api": "openai-completions",
                "timeoutSeconds": self.timeout_s,
                "models": [{"id": endpoint.model, "name": endpoint.model, "reasoning": False, "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": self.context_window, "maxTokens": self.max_tokens}],
            }}},
        }
        node_bin = npm.node24_dir()
        argv = [str(node_bin / "node"), str(self.entry()), "agent", "exec", instruction, "--config",
                str(home / "openclaw.json5"), "--cwd", str(workspace), "--model", f"clawgym/{endpoint.model}", "--json",
                "--timeout", str(self.timeout_s)]
        env = {"OPENCLAW_STATE_DIR": str(home / ".openclaw"), "OPENCLAW_NO_AUTO_UPDATE": "1", "OPENCLAW_DISABLE_BONJOUR": "1",
               # its workers may spawn `node`: Node 24 first on PATH
               "PATH": f"{node_bin}:/usr/local/bin:/usr/bin:/bin"}
        return Launch(argv=argv, env=env, files={"openclaw.json5": json.dumps(config, indent=2)})

    def outcome(self, exit_code: int, stdout: str, stderr: str) -> Outcome:
        result = _last_json_object(stdout)
        if exit_code == 0 and isinstance(result, dict) and result.get("ok"):
            return Outcome("ok", final_message=result.get("final"))
        if exit_code == 2:
            return Outcome("ok", "OpenClaw's own timeout")  # scored as is
        text = json.dumps(result)[:300] if result else (stderr.strip().splitlines() or [""])[-1][:300]
        if any(s in text.lower() for s in ("econnrefused", "fetch failed", "overloaded", "503", "529")):
            return Outcome("infra_error", f"model endpoint failed: {text}")
        return Outcome("harness_error", exit_text(exit_code, text))

    def transcript(self, stdout: str, calls: list[dict]) -> Transcript:
        return from_proxy(calls)  # `--json` prints a summary (final text, tool counts), not the conversation

    def classify(self, tool_names: list[str], last_user_text: str, main_tool_names: list[str]) -> str:
        if any(m in last_user_text.lower() for m in _COMPACTION_MARKERS):
            return "compaction"
        return classify_by_tools(tool_names, main_tool_names)


def _last_json_object(stdout: str) -> dict | None:
    """The last JSON object on stdout. `--json` pretty-prints it over many lines (and may follow
    other output), so read from each line that opens an object, last first, to a full document."""
    decoder = json.JSONDecoder()
    offsets, pos = [], 0
    for line in stdout.splitlines(keepends=True):
        if line.startswith("{"):
            offsets.append(pos)
        pos += len(line)
    for off in reversed(offsets):
        try:
            obj, _ = decoder.raw_decode(stdout, off)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None
