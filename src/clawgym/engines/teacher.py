"""The task teacher: a generated task family's solver, served through the proxy as the engine `teacher`.

An SFT cold start (docs/recipes.md `[sft]`) needs teacher trajectories recorded exactly as a real
teacher model's would be: the harness runs unmodified, every call goes through the proxy, the
proxy renders the prompt with the *served model's* tokenizer and chat template and records the
tokens. This engine stands where that teacher model would. It reads the call's conversation as the
proxy parsed it (`clawgym.engines.base.Chat`: messages and tools, no rendered text, so any chat
template serves), finds the task's instruction and the tool results so far, asks the family
(`clawgym.tasks.families`, option `family`) for the next assistant message (its text and tool
calls), renders that message with the served chat template (the proxy's `--chat-template`, else the
model's own) and returns what a model under that template would generate, as token ids of the
served tokenizer. So the recorded ids are the student's own, in its own template's call form (the
init-model's Hermes `<tool_call>{...}</tool_call>`, SmolLM2's `<tool_call>[...]</tool_call>`,
Llama 3's `{"name": ..., "parameters": ...}`), and the trees, packing and `train --algo sft` see
nothing different from a real teacher.

The instruction is the first user message the family recognises (Codex sends an
`<environment_context>` user message before the task's). What the teacher must know of each
harness to answer it is in `HARNESSES` (its shell tool, the system-prompt line naming its working
directory, the header it puts before a command's output): agentloop, Claude Code, Codex and OpenClaw. A conversation in which it finds no
instruction of its family is an engine error naming the rollout, never a made-up answer.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym.engines.base import Chat, EngineConfig, EngineError, Generation, Sampling, context_window
from clawgym.engines.scripted import text_generation
from clawgym.errors import UserError
from clawgym.models.templates import assistant_completion, load_chat_template
from clawgym.tasks.families import FAMILIES, get_family
from clawgym.tasks.generated import Reply, ToolCall


@dataclass(frozen=True)
class HarnessForm:
    """What the teacher must know of one harness to answer it (docs/harnesses.md has each one's tools)."""

    shell: str
    """its shell tool: the teacher's `bash` calls, and its writes when no write tool is offered, go there"""
    command: str
    """the shell tool's parameter for the command line"""
    workdir: re.Pattern[str] | None = None
    """a system-prompt line naming the working directory: a relative path becomes absolute under it
    for a write tool that takes `file_path` (Claude Code wants absolute paths)"""
    output_header: re.Pattern[str] | None = None
    """what the harness puts before a command's output in a tool result; removed, so the family reads
    what the command printed"""


HARNESSES: dict[str, HarnessForm] = {
    "agentloop": HarnessForm("bash", "command"),
    # the adapter's one-line `CWD: WORKSPACE` system prompt, or Claude Code's own `Working directory:`
    # line; its system blocks arrive run together, so the line may follow other text directly
    "claude-code": HarnessForm("Bash", "command", workdir=re.compile(r"(?:CWD|Working directory): *(/[^\s<]*)")),
    "codex": HarnessForm("exec_command", "cmd", output_header=re.compile(
        r"\A(?:Chunk ID: .*\n)?Wall time: .*\n(?:Process exited with code .*\n)?(?:Original token count: .*\n)?Output:\n")),
    # OpenClaw's `exec` puts the command's output in the tool result as is (`(no output)` when empty,
    # `(Command exited with code N)` after it on failure), and its `write` takes `path` (relative to
    # its `--cwd`) and `content`, as the family's write does, so that goes out unchanged; without
    # `write` (its `tools` option), the write goes through `exec`
    "openclaw": HarnessForm("exec", "command"),
}
"""harness name -> its form; the teacher knows a call's harness by the shell tool it offers (`harness_form`)"""


def offered_tools(chat: Chat) -> dict[str, set[str]]:
    """{tool name: its parameter names} of the tools the call offers."""
    tools: dict[str, set[str]] = {}
    for spec in chat.tools:
        fn = spec.get("function", spec)
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            schema = fn.get("parameters") or {}
            tools[fn["name"]] = set(schema.get("properties") or {}) if isinstance(schema, dict) else set()
    return tools


def harness_form(tools: dict[str, set[str]]) -> HarnessForm | None:
    """The form of the harness whose shell tool (with its command parameter) is offered: by its exact
    name first (agentloop's `bash` is Claude Code's `Bash` up to case), then up to case; None if none is."""
    by_lower = {name.lower(): name for name in tools}
    for exact in (True, False):
        for form in HARNESSES.values():
            name = form.shell if exact else by_lower.get(form.shell.lower())
            if name in tools and form.command in tools[name]:
                return form
    return None


def read_chat(chat: Chat, form: HarnessForm | None) -> tuple[list[str], list[str]]:
    """(the user messages, every tool result in order, without the harness's output header)."""
    users = [str(m.get("content") or "") for m in chat.messages if m.get("role") == "user"]
    results = [str(m.get("content") or "") for m in chat.messages if m.get("role") == "tool"]
    if form is not None and form.output_header is not None:
        results = [form.output_header.sub("", r, count=1) for r in results]
    return users, results


def workdir(chat: Chat, form: HarnessForm | None) -> str | None:
    """The working directory the harness names in its system prompt, if its form says where."""
    if form is None or form.workdir is None:
        return None
    system = "\n".join(str(m.get("content") or "") for m in chat.messages if m.get("role") == "system")
    found = form.workdir.search(system)
    return found.group(1) if found else None


def fit_call(call: ToolCall, tools: dict[str, set[str]], form: HarnessForm | None, cwd: str | None) -> tuple[str, dict[str, Any]]:
    """The family's call in the form of the tools the harness offers (name, arguments).

    A family names its tools as agentloop does (`bash` with `command`, `write` with `path` and
    `content`); a harness may call them otherwise. The offered tool of the same name up to case is
    used (Claude Code's `Bash`, `Write`), `path` becomes `file_path` where the tool takes that, made
    absolute under `cwd`. A `bash` call goes to the harness's shell tool when there is no `bash`
    (Codex's `exec_command`, whose command parameter is `cmd`), and a write with no write tool
    offered is done by the shell tool. With no tools offered, or none that fits, the call goes out
    as the family made it.
    """
    by_lower = {name.lower(): name for name in tools}
    name, args = by_lower.get(call.name.lower()), dict(call.arguments)
    if name is not None and "path" in args and "path" not in tools[name] and "file_path" in tools[name]:
        path = args.pop("path")
        args["file_path"] = str(Path(cwd) / path) if cwd and not path.startswith("/") else path
    if name is None and form is not None:
        shell = by_lower[form.shell.lower()]
        if call.name == "bash" and "command" in args:
            return shell, {form.command: args["command"]}
        if call.name == "write" and {"path", "content"} <= set(args):
            return shell, {form.command: f"printf '%s' {shlex.quote(str(args['content']))} > {shlex.quote(str(args['path']))}"}
    return name or call.name, args


def check_options(options: dict[str, Any]) -> None:
    """A UserError unless the options name a task family (what `from_config` would refuse, checked without loading)."""
    family = options.get("family")
    if not isinstance(family, str) or family not in FAMILIES:
        got = "" if family is None else f", got {family!r}"
        raise UserError(f"the teacher engine needs a task family, one of: {', '.join(sorted(FAMILIES))} (option 'family'{got})")


class TeacherEngine:
    """See the module docstring. It follows `clawgym.engines.base.ReadsChat`: the proxy calls `generate_chat`."""

    def __init__(self, model_dir: Path, family: str, max_context: int | None = None, chat_template: str | None = None):
        from transformers import AutoTokenizer

        self.family = get_family(family)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if chat_template:  # the template the proxy serves, so the answer is in the student's call form
            self.tokenizer.chat_template = load_chat_template(chat_template)
        self.policy_version = 0
        self.max_context = max_context or context_window(model_dir)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "TeacherEngine":
        check_options(config.options)
        return cls(config.model_dir, config.options["family"], config.options.get("max_context"), config.chat_template)

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        raise EngineError(f"the teacher answers from the conversation, not from token ids alone (rollout '{rollout_id}'): "
                          "serve it through the proxy")

    async def generate_chat(self, prompt_ids: list[int], chat: Chat, sampling: Sampling, rollout_id: str = "") -> Generation:
        tools = offered_tools(chat)
        form = harness_form(tools)
        users, results = read_chat(chat, form)
        try:
            reply = self._teach(users, results)
            cwd = workdir(chat, form)
            text = assistant_completion(self.tokenizer, reply.text, [fit_call(c, tools, form, cwd) for c in reply.calls])
        except ValueError as e:
            raise EngineError(f"teacher '{self.family.name}' cannot answer rollout '{rollout_id}': {e}") from None
        return text_generation(self.tokenizer, text, sampling, self.policy_version)

    def _teach(self, users: list[str], results: list[str]) -> Reply:
        """The family's answer to the first user message it takes for its instruction."""
        first: ValueError | None = None
        for instruction in users or [""]:
            try:
                return self.family.teach(instruction, results)
            except ValueError as e:
                first = first or e
        assert first is not None
        raise first

    async def reload(self, checkpoint_dir: Path) -> int:
        raise EngineError("the teacher engine serves a fixed solver; it has no weights to reload")

    async def close(self) -> None:
        pass
