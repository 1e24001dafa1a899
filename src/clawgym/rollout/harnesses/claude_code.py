"""`claude-code`: Anthropic's Claude Code CLI (`claude -p`), unmodified, against the proxy's Messages route.

Everything here comes from driving the real binary (docs/harnesses.md): headless
`-p` with stream-json output (which needs `--verbose`), permissions bypassed (as root only with
`IS_SANDBOX=1`), every model alias pointed at the policy, and nonessential traffic (telemetry,
update checks, title generation) off, so the only connections it opens are to the proxy.
"""

from __future__ import annotations

from pathlib import Path

from clawgym.artifacts import Transcript
from clawgym.rollout.harnesses import npm
from clawgym.rollout.harnesses.base import Endpoint, Launch, Outcome, check_option, classify_by_tools, exit_text, json_lines
from clawgym.rollout.transcript import from_claude_stream, proxy_or

VERSION = "2.1.197"
PACKAGE = f"@anthropic-ai/claude-code@{VERSION}"
# Claude Code's own compaction and title prompts; they mark those calls as not the main agent.
_COMPACTION_MARKERS = ("summary of the conversation so far", "create a detailed summary", "your task is to create a detailed summary")
# what Claude Code says (as an "API Error") when answers keep stopping at max_tokens
_OUTPUT_LIMIT = "output token maximum"
_AUX_MARKERS = ("<system-reminder>\nanalyze",)
# 2.1.197 asks for a session title with its instructions in the system prompt and, as the user
# message, the session's text in <session> tags followed by "Write the title in <language>..."
_TITLE_START, _TITLE_END = "<session>\n", "</session>\n\nwrite the title in "


class ClaudeCode(npm.NpmHarness):
    name = "claude-code"
    protocol = "anthropic"
    package, bin_name, title = PACKAGE, "claude", f"Claude Code {VERSION}"

    def __init__(self, max_turns: int = 20, bare: bool = True, tools: str = "Bash,Read,Write,Edit,Glob,Grep",
                 max_tokens: int | None = None, request_timeout: float = 1800.0):
        check_option(self.name, "max_turns", max_turns, int, 1)
        if max_tokens is not None:
            check_option(self.name, "max_tokens", max_tokens, int, 1)
        check_option(self.name, "request_timeout", request_timeout, (int, float), 0, strict=True)
        self.max_turns, self.bare, self.tools, self.max_tokens = max_turns, bare, tools, max_tokens
        self.request_timeout = float(request_timeout)


    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        argv = [str(self.binary()), "-p", instruction, "--output-format", "stream-json", "--verbose",
                "--dangerously-skip-permissions", "--max-turns", str(self.max_turns), "--no-session-persistence",
                "--model", endpoint.model]
        if self.bare:
            # A one-line system prompt instead of ~19k tokens: prefill dominates on CPU. Not `--bare`:
            # that sets CLAUDE_CODE_SIMPLE, whose tool set is fixed to Bash, Edit and Read whatever
            # `--tools` asks for (docs/harnesses.md).
            argv += ["--system-prompt", f"CWD: {workspace}"]
        if self.tools:
            argv += ["--tools", self.tools]
        m = endpoint.model
        env = {
            "ANTHROPIC_BASE_URL": endpoint.base_url, "ANTHROPIC_API_KEY": endpoint.api_key,
            "ANTHROPIC_MODEL": m, "ANTHROPIC_SMALL_FAST_MODEL": m, "ANTHROPIC_DEFAULT_HAIKU_MODEL": m,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": m, "ANTHROPIC_DEFAULT_OPUS_MODEL": m,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1", "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
            "IS_SANDBOX": "1", "TERM": "dumb", "SHELL": "/bin/bash",
            # The proxy sends a turn once it is generated, with pings meanwhile, which Claude Code's
            # stream watchdog does not count: by default it drops a call after 300 s, and a CPU
            # engine may prefill a prompt that long. Both limits follow `request_timeout`.
            "API_TIMEOUT_MS": str(int(self.request_timeout * 1000)),
            "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(int(self.request_timeout * 1000)),
        }
        if self.max_tokens is not None:
            # Claude Code asks for 32,000 tokens per call: on a CPU engine a call must end well
            # within `request_timeout` (docs/harnesses.md, "Real models on a CPU").
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.max_tokens)
        if self.bare:  # what --bare skips that would still add to the prompt: CLAUDE.md files, auto-memory
            env |= {"CLAUDE_CODE_DISABLE_CLAUDE_MDS": "1", "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1"}
        return Launch(argv=argv, env=env)

    def outcome(self, exit_code: int, stdout: str, stderr: str) -> Outcome:
        result = _last_result(stdout)
        if result is not None and not result.get("is_error"):
            return Outcome("ok", final_message=result.get("result"))
        text = (result or {}).get("result") or (stderr.strip().splitlines() or [""])[-1]
        if result is not None and result.get("subtype") == "error_max_turns":
            return Outcome("ok", "turn limit reached")  # scored as is, like a timeout
        if _OUTPUT_LIMIT in str(text):
            # the policy's answers kept running into max_tokens (Claude Code gives up after a few
            # continuations): the model's own doing, scored, not a failed endpoint
            return Outcome("harness_error", exit_text(exit_code, str(text)[:300]))
        if any(s in (stdout + stderr) for s in ("api_retry", "API Error", "Connection error")):
            return Outcome("infra_error", f"model endpoint failed: {str(text)[:300]}")
        return Outcome("harness_error", exit_text(exit_code, str(text)[:300]))

    def transcript(self, stdout: str, calls: list[dict]) -> Transcript:
        return proxy_or(calls, lambda: from_claude_stream(json_lines(stdout)))

    def classify(self, tool_names: list[str], last_user_text: str, main_tool_names: list[str]) -> str:
        text = last_user_text.lower()
        if any(m in text for m in _COMPACTION_MARKERS):
            return "compaction"
        if any(m in text for m in _AUX_MARKERS) or (text.lstrip().startswith(_TITLE_START) and _TITLE_END in text):
            return "aux"
        return classify_by_tools(tool_names, main_tool_names)


def _last_result(stdout: str) -> dict | None:
    """The final `{"type": "result", ...}` line of stream-json output."""
    return next((e for e in reversed(json_lines(stdout)) if e.get("type") == "result"), None)
