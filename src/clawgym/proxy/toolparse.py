"""Tool-call parsers: turn one complete model output (decoded text) into text, reasoning and tool calls.

The proxy buffers the whole turn and parses it once (paper §3.4, buffered pseudo-streaming), so a
parser here is a plain function over a finished string — no incremental state to get wrong.
Parsers are looked up by model family in `PARSERS`; add one by writing a class with `parse` and a
dict entry.

Hermes / Qwen3 format (`hermes`):

    <think>reasoning</think>            optional, at the start
    text before                          kept as text
    <tool_call>
    {"name": "Bash", "arguments": {"command": "ls"}}
    </tool_call>                         any number of these, anywhere after the text

A block that is not valid JSON with a string `name` (or is left unclosed because generation hit
the token limit) stays in the text verbatim: an unparseable tool call is text, never an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from clawgym.proxy.types import ToolCall


@dataclass
class ParsedOutput:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""


class ToolParser(Protocol):
    def parse(self, text: str) -> ParsedOutput: ...


_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class HermesParser:
    """Qwen3 / Hermes `<tool_call>` JSON blocks, several per turn; `<think>` reasoning split off."""

    def parse(self, text: str) -> ParsedOutput:
        reasoning = ""
        stripped = text.lstrip()
        if stripped.startswith("<think>") and "</think>" in stripped:
            head, _, text = stripped[len("<think>"):].partition("</think>")
            reasoning = head.strip()
        elif "</think>" in text and "<think>" not in text:
            # Qwen3 templates may put `<think>` in the prompt; then only the closing tag is sampled.
            head, _, text = text.partition("</think>")
            reasoning = head.strip()
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for m in _BLOCK.finditer(text):
            call = _parse_call(m.group(1))
            kept.append(text[pos:m.start()])
            if call is None:
                kept.append(m.group(0))
            else:
                calls.append(call)
            pos = m.end()
        kept.append(text[pos:])
        body = "".join(kept)
        # The template puts "\n" between text and a call; drop that, keep everything the model wrote.
        return ParsedOutput(text=body.strip() if calls else body.strip("\n"), tool_calls=calls, reasoning=reasoning)


def _parse_call(raw: str) -> ToolCall | None:
    try:
        obj = orjson.loads(raw.strip())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            parsed = orjson.loads(args)
            if isinstance(parsed, dict):
                args = parsed
        except orjson.JSONDecodeError:
            pass
    if args is None:
        args = {}
    if not isinstance(args, dict):  # every protocol wants an object; anything else stays text
        return None
    return ToolCall(name=obj["name"], arguments=args)


PARSERS: dict[str, ToolParser] = {
    "hermes": HermesParser(),
    "qwen3": HermesParser(),
}
