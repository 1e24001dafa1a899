"""`codex`: OpenAI's Codex CLI (`codex exec`), unmodified, against the proxy's Responses route.

From driving the real binary (docs/harnesses.md, "codex"): Codex speaks only the Responses API;
a per-run `$CODEX_HOME/config.toml` names the proxy as a model provider, turns approvals and the
sandbox off (the rollout's own sandbox isolates it), and turns off plugins, analytics, feedback,
multi-agent tools and web search, so it connects to nothing but the proxy.

As installed, its first prompt is about 6k tokens, most of it the built-in instructions (~17k
characters). `slim` replaces them, through documented config keys, with a one-line instructions file
naming the working folder (as Claude Code's `bare` does), and leaves out what a rollout does not use:
the skills list, the permissions and environment-context messages, and the `request_user_input` and
`view_image` tools. `exec_command` and `write_stdin` stay (docs/harnesses.md, "codex").
"""

from __future__ import annotations

import json
from pathlib import Path

from clawgym.artifacts import Transcript
from clawgym.rollout.harnesses import npm
from clawgym.proxy.types import MAX_TOKENS_HEADER
from clawgym.rollout.harnesses.base import Endpoint, Launch, Outcome, check_flag, check_option, classify_by_tools, exit_text, json_lines
from clawgym.rollout.transcript import from_codex_events, proxy_or

VERSION = "0.171.0"
PACKAGE = f"@openai/codex@{VERSION}"
_COMPACTION_MARKERS = ("context checkpoint compaction", "create a handoff summary", "summarize the conversation")

CONFIG = """\
model = "{model}"
model_provider = "clawgym"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
model_context_window = {context_window}
web_search = "disabled"

[model_providers.clawgym]
name = "clawgym proxy"
base_url = "{base_url}/v1"
env_key = "CLAWGYM_API_KEY"
wire_api = "responses"
request_max_retries = {retries}
stream_max_retries = {retries}
stream_idle_timeout_ms = {idle_ms}
{headers}
[agents]
enabled = false
[analytics]
enabled = false
[feedback]
enabled = false
[features]
plugins = false
goals = false
{slim_features}"""

# what `slim` adds: the tables above take its first lines, so it opens with the [features] keys
SLIM = """\
view_image = false
[skills]
include_instructions = false
[tools]
experimental_request_user_input = { enabled = false }
"""
# the root keys `slim` sets; TOML wants them before the first table
SLIM_ROOT = """\
model_instructions_file = {instructions}
include_permissions_instructions = false
include_environment_context = false
"""


class Codex(npm.NpmHarness):
    name = "codex"
    protocol = "openai-responses"
    package, bin_name, title = PACKAGE, "codex", f"Codex {VERSION}"

    def __init__(self, context_window: int = 32768, retries: int = 2, idle_timeout_s: int = 600, max_tokens: int | None = None,
                 slim: bool = False):
        for key, value, low in (("context_window", context_window, 1), ("retries", retries, 0), ("idle_timeout_s", idle_timeout_s, 1)):
            check_option(self.name, key, value, int, low)
        if max_tokens is not None:
            check_option(self.name, "max_tokens", max_tokens, int, 1)
        check_flag(self.name, "slim", slim)
        self.context_window, self.retries, self.idle_timeout_s = context_window, retries, idle_timeout_s
        self.max_tokens, self.slim = max_tokens, slim

    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        instructions = home / ".codex" / "instructions.md"
        root = SLIM_ROOT.format(instructions=json.dumps(str(instructions))) if self.slim else ""  # json.dumps: a TOML string
        config = root + CONFIG.format(model=endpoint.model, base_url=endpoint.base_url.rstrip("/"), context_window=self.context_window,
                                      retries=self.retries, idle_ms=self.idle_timeout_s * 1000, headers=self._headers(),
                                      slim_features=SLIM if self.slim else "")
        files = {".codex/config.toml": config} | ({".codex/instructions.md": f"CWD: {workspace}\n"} if self.slim else {})
        argv = [str(self.binary()), "exec", "--json", "--skip-git-repo-check", "--ephemeral", "-C", str(workspace),
                "--dangerously-bypass-approvals-and-sandbox", instruction]
        env = {"CODEX_HOME": str(home / ".codex"), "CLAWGYM_API_KEY": endpoint.api_key}
        return Launch(argv=argv, env=env, files=files)

    def _headers(self) -> str:
        # Codex sends no max_output_tokens and has no setting for it: the proxy caps each call by
        # this header instead (docs/harnesses.md, "codex"), else a CPU engine may write for minutes.
        if self.max_tokens is None:
            return ""
        return f'http_headers = {{ "{MAX_TOKENS_HEADER}" = "{self.max_tokens}" }}\n'

    def outcome(self, exit_code: int, stdout: str, stderr: str) -> Outcome:
        events = json_lines(stdout)
        if exit_code == 0 and any(e.get("type") == "turn.completed" for e in events):
            messages = [e["item"].get("text") for e in events
                        if e.get("type") == "item.completed" and isinstance(e.get("item"), dict) and e["item"].get("type") == "agent_message"]
            return Outcome("ok", final_message=messages[-1] if messages else None)
        failed = [e for e in events if e.get("type") in ("turn.failed", "error")]
        text = json.dumps(failed[-1])[:300] if failed else (stderr.strip().splitlines() or [""])[-1][:300]
        # the proxy's "overloaded" (an engine failure) reads "Selected model is at capacity", and Codex does not retry it
        if any(s in text.lower() for s in ("stream disconnected", "connection", "error sending request", "at capacity",
                                           "overloaded", "429", "500", "503")):
            return Outcome("infra_error", f"model endpoint failed: {text}")
        return Outcome("harness_error", exit_text(exit_code, text))

    def transcript(self, stdout: str, calls: list[dict]) -> Transcript:
        return proxy_or(calls, lambda: from_codex_events(json_lines(stdout)))

    def classify(self, tool_names: list[str], last_user_text: str, main_tool_names: list[str]) -> str:
        if any(m in last_user_text.lower() for m in _COMPACTION_MARKERS):
            return "compaction"
        return classify_by_tools(tool_names, main_tool_names)
