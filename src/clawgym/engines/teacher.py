"""The teacher engine: a generated task family's solver, served through the proxy like any policy.

An SFT cold start (docs/recipes.md `[sft]`) needs teacher trajectories recorded exactly as a real
teacher model's would be: the harness runs unmodified, every call goes through the proxy, the
proxy renders the prompt with the *served model's* tokenizer and chat template and records the
tokens. This engine stands where that teacher model would: it reads the rendered prompt back as
text, finds the task's instruction and the tool results so far, asks the family
(`clawgym.tasks.families`, option `family`) for the next assistant message (its text and tool
calls), renders that message with the served chat template (the proxy's `--chat-template`, else the
model's own) and returns what a model under that template would generate, as token ids of the
served tokenizer. So the recorded ids are the student's own, in its own template's call form (the
init-model's Hermes `<tool_call>{...}</tool_call>`, SmolLM2's `<tool_call>[...]</tool_call>`), and
the trees, packing and `train --algo sft` see nothing different from a real teacher.

The teacher reads ChatML prompts (`<|im_start|>user ... <|im_end|>`, tool results in
`<tool_response>` blocks): the init-model template, Qwen3 and SmolLM2 use them. The instruction is
the first user message the family recognises (Codex sends an `<environment_context>` user message
before the task's), and a tool result loses the header a harness puts before the command's output
(Codex's `Chunk ID: ... Output:` lines), so the family reads what the command printed. A prompt in
which it finds no instruction of its family is an engine error naming the rollout, never a made-up
answer.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from clawgym.engines.base import EngineConfig, EngineError, Generation, Sampling, context_window
from clawgym.engines.scripted import text_generation
from clawgym.errors import UserError
from clawgym.tasks.generated import ToolCall
from clawgym.templates import assistant_completion, load_chat_template

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_CWD = re.compile(r"(?:CWD|Working directory): *(/[^\s<]*)")  # Claude Code's system blocks arrive run together
_OUTPUT_HEADER = re.compile(r"\A(?:Chunk ID: .*\n)?Wall time: .*\n(?:Process exited with code .*\n)?(?:Original token count: .*\n)?Output:\n")
"""the lines Codex's exec_command puts before a command's output (docs/harnesses.md, "codex")"""
SHELLS = ("bash", "shell", "exec", "exec_command")
"""tool names (up to case) that run a shell command: the teacher's `bash` calls, and its writes when the
harness offers no write tool, go to the first offered one"""
COMMAND_PARAMS = ("command", "cmd")
"""a shell tool's parameter for the command line (agentloop and Claude Code: command; Codex: cmd)"""


def read_prompt(text: str) -> tuple[list[str], list[str]]:
    """(the user messages that are not tool results, every tool result in order) of a ChatML prompt.

    A tool result loses a harness's header before the command's output (`_OUTPUT_HEADER`)."""
    users = [u for u in _USER.findall(text) if not u.lstrip().startswith("<tool_response>")]
    return users, [_OUTPUT_HEADER.sub("", r, count=1) for r in _TOOL_RESPONSE.findall(text)]


def offered_tools(text: str) -> dict[str, set[str]] | None:
    """{tool name: its parameter names} of the prompt's `<tools>` block (a JSON object a line), None without one."""
    block = _TOOLS.search(text)
    if block is None:
        return None
    tools: dict[str, set[str]] = {}
    for line in block.group(1).splitlines():
        try:
            spec = json.loads(line)
        except ValueError:
            continue
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            schema = fn.get("parameters") or fn.get("input_schema") or {}
            tools[fn["name"]] = set(schema.get("properties") or {})
    return tools


def fit_call(call: ToolCall, tools: dict[str, set[str]] | None, text: str) -> tuple[str, dict[str, Any]]:
    """The family's call in the form of the tools the harness offers (name, arguments).

    A family names its tools as agentloop does (`bash` with `command`, `write` with `path` and
    `content`); a harness may call them otherwise. The offered tool of the same name up to case is
    used (Claude Code's `Bash`, `Write`), `path` becomes `file_path` where the tool takes that, made
    absolute under the working directory the prompt names (Claude Code wants absolute paths). A
    `bash` call goes to the offered shell tool when there is no `bash` (Codex's `exec_command`, whose
    command parameter is `cmd`), and a write with no write tool offered is done by the shell tool.
    With no `<tools>` block, or no tool that fits, the call goes out as the family made it.
    """
    if not tools:
        return call.name, dict(call.arguments)
    by_lower = {name.lower(): name for name in tools}
    name, args = by_lower.get(call.name.lower()), dict(call.arguments)
    if name is not None and "path" in args and "path" not in tools[name] and "file_path" in tools[name]:
        path = args.pop("path")
        cwd = _CWD.search(text)
        args["file_path"] = str(Path(cwd.group(1)) / path) if cwd and not path.startswith("/") else path
    if name is None and (shell := _shell_tool(tools, by_lower)) is not None:
        tool, param = shell
        if call.name == "bash" and "command" in args:
            return tool, {param: args["command"]}
        if call.name == "write" and {"path", "content"} <= set(args):
            return tool, {param: f"printf '%s' {shlex.quote(str(args['content']))} > {shlex.quote(str(args['path']))}"}
    return name or call.name, args


def _shell_tool(tools: dict[str, set[str]], by_lower: dict[str, str]) -> tuple[str, str] | None:
    """(name, command parameter) of the first offered shell tool (`SHELLS`), None without one."""
    for s in SHELLS:
        if s in by_lower:
            param = next((p for p in COMMAND_PARAMS if p in tools[by_lower[s]]), None)
            if param is not None:
                return by_lower[s], param
    return None


class TeacherEngine:
    """See the module docstring."""

    def __init__(self, model_dir: Path, family: str, max_context: int | None = None, chat_template: str | None = None):
        from transformers import AutoTokenizer

        from clawgym.tasks.families import get_family

        self.family = get_family(family)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if chat_template:  # the template the proxy serves, so the answer is in the student's call form
            self.tokenizer.chat_template = load_chat_template(chat_template)
        self.policy_version = 0
        self.max_context = max_context or context_window(model_dir)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "TeacherEngine":
        family = config.options.get("family")
        if not isinstance(family, str):
            raise UserError("the teacher engine needs the option 'family' (a generated task family, e.g. scan)")
        return cls(config.model_dir, family, config.options.get("max_context"), config.chat_template)

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        users, results = read_prompt(prompt)
        try:
            reply = self._teach(users, results)
            tools = offered_tools(prompt)
            text = assistant_completion(self.tokenizer, reply.text, [fit_call(c, tools, prompt) for c in reply.calls])
        except ValueError as e:
            raise EngineError(f"teacher '{self.family.name}' cannot answer rollout '{rollout_id}': {e}") from None
        return text_generation(self.tokenizer, text, sampling, self.policy_version)

    def _teach(self, users: list[str], results: list[str]):
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
