"""What every harness adapter provides: how to launch it against the proxy, read its outcome, classify its calls.

A harness is an agent program we do not modify. Its adapter says how to install it, which wire
protocol it speaks, the command line and environment that point it at a rollout's proxy URL with
telemetry and outside traffic off, how to read its final status from the exit code and output, and
how to read what the agent did (its transcript), which of its model calls are the main agent, a subagent, a compaction or an auxiliary call (title
generation and the like). Adapters are looked up by name in `clawgym.rollout.harnesses.HARNESSES`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from clawgym.errors import UserError

if TYPE_CHECKING:
    from clawgym.artifacts import Transcript


@dataclass(frozen=True)
class Endpoint:
    """Where a rollout's model calls go: the proxy's per-rollout URL and key."""

    base_url: str
    """e.g. http://127.0.0.1:8100/r/<rollout_id> (no trailing /v1)"""
    api_key: str
    model: str = "clawgym-policy"
    """the model name the harness is told to ask for"""


@dataclass
class Launch:
    """A harness process to start in the sandbox, with the workspace as its working directory."""

    argv: list[str]
    env: dict[str, str]
    """added to the sandbox's base environment (PATH, HOME, TMPDIR, LANG are the sandbox's)"""
    files: dict[str, str] = field(default_factory=dict)
    """config files to write before start, relative to the sandbox's HOME"""

    def write_files(self, home: Path) -> None:
        for rel, text in self.files.items():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            (home / rel).write_text(text)


@dataclass(frozen=True)
class Outcome:
    """How the harness ended, read from its exit code and output."""

    status: str
    """ok | harness_error | infra_error (the model endpoint failed)"""
    message: str = ""
    final_message: str | None = None
    """the agent's final answer as the harness reported it (checks read it as $CLAWGYM_FINAL_MESSAGE)"""


class Harness(Protocol):
    """An adapter. Two methods are optional: `install()` (an npm harness: `clawgym harness install`)
    and `prepare()`, which the runner calls once per rollout stage before any rollout starts, for
    one-time work on this machine that rollouts would otherwise each repeat (OpenClaw: its compile
    cache). `prepare` must be quick when there is nothing to do, and must not fail a run."""

    name: str
    protocol: str
    """anthropic | openai-chat | openai-responses"""

    def missing(self) -> str | None:
        """Why the harness cannot run here (not installed, ...), or None when it can."""
        ...

    def launch(self, instruction: str, workspace: Path, home: Path, endpoint: Endpoint) -> Launch:
        ...

    def outcome(self, exit_code: int, stdout: str, stderr: str) -> Outcome:
        ...

    def transcript(self, stdout: str, calls: list[dict]) -> "Transcript":
        """What the agent did, for graders and the judge: from the proxy's conversation log of the
        rollout (`calls`, see `clawgym.rollout.transcript.from_proxy`) and/or the harness's output."""
        ...

    def classify(self, tool_names: list[str], last_user_text: str, main_tool_names: list[str]) -> str:
        """The role of one recorded call: main | subagent | compaction | aux.

        `last_user_text` is the text of the request's last user message; `main_tool_names` are the
        tools of the rollout's first call, which is the main agent's.
        """
        ...


def exit_text(exit_code: int, detail: str = "") -> str:
    """`exit code N` (with the signal's name when a shell or bwrap reports a kill as 128+N, or the
    code is negative), then the detail if there is one: the message of a harness_error."""
    import signal

    text = f"exit code {exit_code}"
    num = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    if num:
        try:
            text += f" (killed by {signal.Signals(num).name})"
        except ValueError:
            pass
    return f"{text}: {detail}" if detail else text


def check_option(harness: str, key: str, value, kind, low: float, strict: bool = False) -> None:
    """An adapter option's type and lower bound, or a UserError naming it (bools are not numbers here).
    Options come from recipes and --harness-option unchecked: a bad one fails once, before any rollout."""
    ok = isinstance(value, kind) and not isinstance(value, bool) and (value > low if strict else value >= low)
    if not ok:
        what = "an integer" if kind is int else "a number"
        raise UserError(f"{harness} option '{key}' must be {what} {'>' if strict else '>='} {low:g}, got {value!r}")


def check_flag(harness: str, key: str, value) -> None:
    """An adapter's on/off option, or a UserError naming it (a recipe's "yes" or 1 is not a flag)."""
    if not isinstance(value, bool):
        raise UserError(f"{harness} option '{key}' must be true or false, got {value!r}")


def classify_by_tools(tool_names: list[str], main_tool_names: list[str]) -> str:
    """The common rule: no tools → an auxiliary call (titles, summaries of text); tools other than
    the main agent's → a subagent (harnesses give subagents their own tool sets); else main."""
    if not tool_names:
        return "aux"
    if main_tool_names and sorted(tool_names) != sorted(main_tool_names):
        return "subagent"
    return "main"


def call_roles(harness: Harness, calls: list[dict]) -> dict[int, str]:
    """seq -> role of each call of one rollout, by the harness's `classify`, from the proxy's
    conversation log of the rollout (`clawgym.proxy.conversation`: each call's `seq`, `tools` and
    `last_user`). The main agent's tools are those of the first call, in seq order, that offers any
    (a title call may come first)."""
    main: list[str] = []
    roles = {}
    for c in sorted(calls, key=lambda c: c["seq"]):
        tools = list(c.get("tools") or [])
        main = main or tools
        roles[int(c["seq"])] = harness.classify(tools, str(c.get("last_user") or ""), main)
    return roles


def json_lines(stdout: str) -> list[dict]:
    """The JSON objects a harness printed one per line (`--json`, stream-json), other lines skipped."""
    out = []
    for line in stdout.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out
