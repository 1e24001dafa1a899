"""The proxy's internal vocabulary, shared by the three protocol modules, rendering and the server.

Every protocol parses its request body into a `ChatRequest` (messages in the chat-template shape
the model's own template consumes, tools as JSON-schema functions) and builds its answer from a
`Turn` (the parsed model output). A client mistake raises `ProtocolError`, which each protocol
turns into its own error shape and status.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

MAX_TOKENS_HEADER = "x-clawgym-max-tokens"
"""a request header the proxy reads as a cap on the call's new tokens: for harnesses that cannot set
max_tokens themselves (Codex; docs/harnesses.md)"""


class ProtocolError(Exception):
    """A request the proxy refuses. `kind` is protocol-neutral; each protocol maps it to its shape.

    kinds: invalid_request (400), context_length (400), call_budget (400: the rollout's calls are
    spent), authentication (401), permission (403), not_found (404), too_large (413), overloaded
    (529 Anthropic / 503 OpenAI), internal (500), conflict (409, admin routes only).
    """

    def __init__(self, kind: str, message: str, param: str | None = None):
        super().__init__(message)
        self.kind, self.message, self.param = kind, message, param


def require(cond: bool, message: str, param: str | None = None) -> None:
    if not cond:
        raise ProtocolError("invalid_request", message, param)


def number(body: dict, key: str) -> float | None:
    """body[key] as a float, None when absent; a non-number (a bool included) is a 400 naming the key."""
    v = body.get(key)
    if v is None:
        return None
    require(isinstance(v, (int, float)) and not isinstance(v, bool), f"{key} must be a number", key)
    return float(v)


@dataclass
class ToolCall:
    name: str
    arguments: Any
    """a dict (JSON object) in the normal case; a string when the model's JSON was not an object"""
    id: str = ""
    kind: str = "function"
    """function | custom (Responses freeform tools: `arguments` is {"input": str})"""
    namespace: str = ""
    """Responses namespace tools: the model sees `namespace.name`"""

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}" if self.namespace else self.name

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(self.arguments).decode()


@dataclass
class Message:
    """One chat message in the template's shape. Assistant turns carry their tool calls."""

    role: str
    """system | user | assistant | tool"""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""
    """assistant thinking the harness echoed back (never rendered: sampled ids replace it)"""
    tool_call_id: str = ""

    def template_dict(self) -> dict:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "id": c.id, "function": {"name": c.qualified_name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.role == "tool" and self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        return d


@dataclass
class ToolSpec:
    """A tool offered to the model, as a JSON-schema function."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: str = "function"
    """function | custom (freeform string input, rendered as a function with one `input` string)"""
    namespace: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}" if self.namespace else self.name

    def template_dict(self) -> dict:
        return {"type": "function", "function": {"name": self.qualified_name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass
class ChatRequest:
    """One model call, protocol-neutral."""

    protocol: str
    model: str
    messages: list[Message]
    tools: list[ToolSpec]
    max_tokens: int | None
    """None: the protocol did not say; the proxy fills the rest of the context window (capped)"""
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    tool_choice: Any = None
    include_usage: bool = False
    """OpenAI chat: stream_options.include_usage"""
    extra: dict = field(default_factory=dict)
    """protocol-specific echo fields (Responses: tools, tool_choice, ...)"""
    normalized: dict[str, str] = field(default_factory=dict)
    """text the parser rewrote before tokenizing, as sent: {what: original} (Claude Code's billing line)"""

    def sampling_json(self) -> str:
        d = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
             "top_k": self.top_k, "seed": self.seed, "stop": self.stop or None, "tool_choice": self.tool_choice}
        return orjson.dumps({k: v for k, v in d.items() if v is not None}, option=orjson.OPT_SORT_KEYS).decode()

    def system_hash(self) -> str:
        text = self.messages[0].content if self.messages and self.messages[0].role == "system" else ""
        return hashlib.sha256(text.encode()).hexdigest()[:16] if text else ""

    def tool_by_name(self, qualified: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.qualified_name == qualified), None)


@dataclass
class Turn:
    """The model's output for one call, parsed once (buffered pseudo-streaming)."""

    text: str
    tool_calls: list[ToolCall]
    reasoning: str
    finish_reason: str
    """stop | length | tool_calls"""
    prompt_tokens: int
    output_tokens: int
    stop_sequence: str | None = None
    """the request's stop string that ended the turn, if one did"""


def content_text(content: Any, *, allowed: tuple[str, ...] = ("text", "input_text", "output_text"), where: str = "content") -> str:
    """Flatten a string or a list of content parts into text; images and files become a marker."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    require(isinstance(content, list), f"{where} must be a string or a list of content parts", where)
    out = []
    for i, part in enumerate(content):
        require(isinstance(part, dict), f"{where}[{i}] must be an object", f"{where}[{i}]")
        t = part.get("type")
        if t in allowed or (t is None and "text" in part):
            require(isinstance(part.get("text"), str), f"{where}[{i}].text must be a string", f"{where}[{i}].text")
            out.append(part["text"])
        elif t in ("image", "image_url", "input_image", "document", "input_file", "file"):
            out.append(f"[{t} omitted]")
        # Other part types (cache markers, thinking echoes handled by callers) carry no prompt text.
    return "".join(out)


def parse_arguments(args: Any) -> Any:
    """Tool-call arguments as a harness echoes them (a JSON string or an object) -> a dict when possible."""
    if isinstance(args, str):
        try:
            parsed = orjson.loads(args) if args.strip() else {}
        except orjson.JSONDecodeError:
            return args  # keep the string: the template renders it verbatim
        return parsed if isinstance(parsed, dict) else args
    return {} if args is None else args


def fold_system(messages: list[Message]) -> list[Message]:
    """Merge leading system messages into one (Codex sends two developer messages up front)."""
    if len(messages) < 2 or messages[0].role != "system" or messages[1].role != "system":
        return messages
    n = 0
    while n < len(messages) and messages[n].role == "system":
        n += 1
    merged = Message("system", "\n\n".join(m.content for m in messages[:n]))
    return [merged] + messages[n:]


def sse(data: Any, event: str | None = None) -> bytes:
    """One server-sent event; `event:` line first where the protocol names its events."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + (data if isinstance(data, bytes) else orjson.dumps(data)) + b"\n\n"


def new_id(prefix: str) -> str:
    import secrets

    return prefix + secrets.token_hex(12)
