"""Tool-call parsers: turn one complete model output (decoded text) into text, reasoning and tool calls.

The proxy buffers the whole turn and parses it once (paper §3.4, buffered pseudo-streaming), so a
parser here is a plain function over a finished string — no incremental state to get wrong.
Parsers are looked up by name in `PARSERS` (docs/engines.md, "Tool-call parsers"); add one by
writing a class with `parse` and a dict entry. `detect` picks one from the model's chat template.

`hermes` (Qwen2.5/Qwen3, Hermes and the tiny init model): one JSON object per block, any number of
blocks anywhere after the text.

    <think>reasoning</think>            optional, at the start
    text before                          kept as text
    <tool_call>
    {"name": "Bash", "arguments": {"command": "ls"}}
    </tool_call>

`json-list` (SmolLM2's own form): each block holds a JSON *list* of calls.

    <tool_call>[{"name": "Bash", "arguments": {...}}, {"name": "Read", "arguments": {...}}]</tool_call>

`llama3-json` (Llama 3.1/3.2/3.3): the whole turn is one or more JSON objects separated by `;`,
optionally after `<|python_tag|>` (text before the tag is kept as text); the arguments key is
`parameters` (or `arguments`).

    <|python_tag|>{"name": "Bash", "parameters": {"command": "ls"}}

A call that is not valid JSON with a string `name` and object arguments (or a block left unclosed
because generation hit the token limit) stays in the text verbatim: an unparseable tool call is
text, never an error. The three forms are disjoint (a `hermes` block never parses as `json-list`
and the reverse), which is what makes detection from the template unambiguous.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import orjson

from clawgym.errors import UserError
from clawgym.proxy.types import ToolCall


@dataclass
class ParsedOutput:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""


class ToolParser(Protocol):
    def parse(self, text: str) -> ParsedOutput: ...


_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"


def _split_think(text: str) -> tuple[str, str]:
    """(reasoning, rest): a leading `<think>…</think>` block, or text up to a lone `</think>`."""
    stripped = text.lstrip()
    if stripped.startswith("<think>") and "</think>" in stripped:
        head, _, rest = stripped[len("<think>"):].partition("</think>")
        return head.strip(), rest
    if "</think>" in text and "<think>" not in text:
        # Qwen3 templates may put `<think>` in the prompt; then only the closing tag is sampled.
        head, _, rest = text.partition("</think>")
        return head.strip(), rest
    return "", text


class TaggedJsonParser:
    """`<tool_call>…</tool_call>` blocks whose JSON body `block` turns into calls (None: keep as text)."""

    def __init__(self, block: Callable[[Any], list[ToolCall] | None]):
        self.block = block

    def parse(self, text: str) -> ParsedOutput:
        reasoning, text = _split_think(text)
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for m in _BLOCK.finditer(text):
            found = self.block(_loads(m.group(1)))
            kept.append(text[pos:m.start()])
            if found is None:
                kept.append(m.group(0))
            else:
                calls += found
            pos = m.end()
        kept.append(text[pos:])
        body = "".join(kept)
        # The template puts "\n" between text and a call; drop that, keep everything the model wrote.
        return ParsedOutput(text=body.strip() if calls else body.strip("\n"), tool_calls=calls, reasoning=reasoning)


class HermesParser(TaggedJsonParser):
    """Qwen3 / Hermes `<tool_call>` JSON objects, several per turn; `<think>` reasoning split off."""

    def __init__(self) -> None:
        super().__init__(lambda obj: None if (call := _call(obj)) is None else [call])


class JsonListParser(TaggedJsonParser):
    """SmolLM2's `<tool_call>[{…}, …]</tool_call>`: a non-empty JSON list of calls per block."""

    def __init__(self) -> None:
        super().__init__(_call_list)


class Llama3JsonParser:
    """Llama 3.x JSON tool calls: `[<|python_tag|>]{"name": …, "parameters": {…}}[; {…}]…`."""

    def parse(self, text: str) -> ParsedOutput:
        tag = text.find(PYTHON_TAG)
        before, body = (text[:tag], text[tag + len(PYTHON_TAG):]) if tag >= 0 else ("", text)
        if tag < 0 and not body.lstrip().startswith("{"):  # without the tag, a call is the whole turn
            return ParsedOutput(text=text.strip("\n"))
        calls, pos, dec = [], 0, _Decoder(body)
        while True:
            obj, end = dec.next_object(pos)
            call = _call(obj) if obj is not None else None
            if call is None:
                break
            calls.append(call)
            pos = dec.skip_separator(end)
        rest = body[pos:].strip()
        if not calls or rest.startswith(("{", ";")):  # nothing parsed, or a later call is malformed
            return ParsedOutput(text=text.strip("\n"))
        return ParsedOutput(text="\n".join(s for s in (before.strip(), rest) if s), tool_calls=calls)


class _Decoder:
    """Consecutive JSON objects in a string (orjson has no raw_decode: the end is found by bracket matching)."""

    def __init__(self, s: str):
        self.s = s

    def next_object(self, pos: int) -> tuple[Any, int]:
        s = self.s
        while pos < len(s) and s[pos].isspace():
            pos += 1
        if pos >= len(s) or s[pos] != "{":
            return None, pos
        depth, i, in_str = 0, pos, False
        while i < len(s):
            c = s[i]
            if in_str:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    obj = _loads(s[pos:i + 1])
                    return (obj, i + 1) if obj is not _BAD else (None, pos)
            i += 1
        return None, pos  # unclosed: generation stopped inside the call

    def skip_separator(self, pos: int) -> int:
        s = self.s
        j = pos
        while j < len(s) and s[j].isspace():
            j += 1
        return j + 1 if j < len(s) and s[j] == ";" else pos


_BAD = object()


def _loads(raw: str) -> Any:
    try:
        return orjson.loads(raw.strip())
    except orjson.JSONDecodeError:
        return _BAD


def _call(obj: Any) -> ToolCall | None:
    """A call object `{"name": str, "arguments"|"parameters": object}`, or None."""
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


def _call_list(obj: Any) -> list[ToolCall] | None:
    if not isinstance(obj, list) or not obj:
        return None
    calls = [_call(o) for o in obj]
    return None if any(c is None for c in calls) else calls


PARSERS: dict[str, ToolParser] = {
    "hermes": HermesParser(),
    "qwen3": HermesParser(),
    "json-list": JsonListParser(),
    "smollm2": JsonListParser(),
    "llama3-json": Llama3JsonParser(),
}
AUTO = "auto"
DEFAULT = "hermes"
# The forms `detect` tries, one name per distinct parser.
_FORMS = ("hermes", "json-list", "llama3-json")


def check_name(name: str) -> str:
    """`name` if it is `auto` or a parser; else a UserError listing the choices."""
    if name != AUTO and name not in PARSERS:
        raise UserError(f"unknown tool parser '{name}'; choose one of: {AUTO}, {', '.join(PARSERS)}")
    return name


PROBE_CALL = ToolCall("clawgym_probe", {"probe_arg": "probe value"})


def detect(render: Callable[[list[dict], list[dict], bool], str]) -> tuple[str, str]:
    """The parser whose form the chat template writes tool calls in: (name, why).

    `render(messages, tools, add_generation_prompt)` is the template. It renders one assistant turn
    holding one probe call; the text after the generation prompt is tried with every form. Exactly
    one form reading the probe back is a detection; none or several (a template that drops tool
    calls, or writes them some other way) falls back to `hermes`, saying so.
    """
    tools = [{"type": "function", "function": {"name": PROBE_CALL.name, "description": "probe",
                                               "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"}}}}}]
    user = [{"role": "user", "content": "probe"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "call_probe", "function": {"name": PROBE_CALL.name, "arguments": PROBE_CALL.arguments}}]}
    try:
        prompt = render(user, tools, True)
        text = render(user + [turn], tools, False)
    except Exception as e:  # a template that refuses the probe conversation cannot be read
        return DEFAULT, f"default: the chat template could not render a tool call ({type(e).__name__}: {e})"
    body = text[len(prompt):] if text.startswith(prompt) else text[text.rfind("probe") + len("probe"):]
    found = [name for name in _FORMS if _reads_probe(PARSERS[name].parse(body))]
    if len(found) == 1:
        return found[0], "detected from the chat template"
    if not found:
        return DEFAULT, "default: the chat template writes tool calls in no known form"
    return DEFAULT, f"default: the chat template's tool calls read as {' and '.join(found)}"


def _reads_probe(parsed: ParsedOutput) -> bool:
    return [(c.name, c.arguments) for c in parsed.tool_calls] == [(PROBE_CALL.name, PROBE_CALL.arguments)]


def choose(name: str, render: Callable[[list[dict], list[dict], bool], str]) -> tuple[str, str]:
    """The parser to serve with: `name` as given, or for `auto` the detected one; (name, why)."""
    check_name(name)
    if name == AUTO:
        return detect(render)
    return name, "chosen with --tool-parser"
