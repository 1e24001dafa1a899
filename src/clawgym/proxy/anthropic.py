"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`): what Claude Code speaks.

Parsing accepts everything harnesses.md §5 lists: `?beta=true`, system as a string or blocks with
`cache_control`, `role:"system"` messages inside `messages` (Claude Code's mid-conversation-system
beta; kept in place as system turns, which Qwen-style templates render), `tool_result` blocks with
string or block content, and the fields a local model ignores (`thinking`, `output_config`,
`metadata`, `context_management`). Streams carry `event:` lines — the Anthropic SDKs dispatch on
them, and Claude Code falls back to non-streaming calls without them.

Claude Code opens its system prompt with a billing line, `x-anthropic-billing-header:
cc_version=2.1.197.<fingerprint>; ...`, whose fingerprint changes between runs; the proxy drops
the fingerprint before tokenizing, so every rollout's prompt starts the same, and keeps the line as
sent in `ChatRequest.normalized` (the call record's `normalized_json`), docs/harnesses.md.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from clawgym.proxy.types import (ChatRequest, Message, ProtocolError, ToolCall, ToolSpec, Turn, content_text, new_id,
                                 number, require, sse)

PROTOCOL = "anthropic"

# ProtocolError.kind -> (HTTP status, Anthropic error type)
ERRORS = {
    "invalid_request": (400, "invalid_request_error"),
    "context_length": (400, "invalid_request_error"),
    "call_budget": (400, "invalid_request_error"),
    "authentication": (401, "authentication_error"),
    "permission": (403, "permission_error"),
    "not_found": (404, "not_found_error"),
    "too_large": (413, "request_too_large"),
    "overloaded": (529, "overloaded_error"),
    "internal": (500, "api_error"),
}


def error(kind: str, message: str, param: str | None = None) -> tuple[int, dict]:
    status, etype = ERRORS.get(kind, ERRORS["internal"])
    return status, {"type": "error", "error": {"type": etype, "message": message}}


def context_error(n_prompt: int, window: int) -> ProtocolError:
    # The wording Anthropic uses; Claude Code matches "prompt is too long" to start compaction.
    return ProtocolError("context_length", f"prompt is too long: {n_prompt} tokens > {window - 1} maximum")


# the billing line's version with its per-run fingerprint (`cc_version=2.1.197.38b`): group 1 is kept
_BILLING = re.compile(r"^(x-anthropic-billing-header:[^\n]*?\bcc_version=\d+\.\d+\.\d+)\.[0-9A-Za-z]+")


def normalize_billing_header(system: str) -> tuple[str, str | None]:
    """`system` with Claude Code's billing-line fingerprint dropped, and the text it replaced as
    sent (the prompt's start up to the fingerprint), or None when the prompt has no billing line."""
    m = _BILLING.match(system)
    if m is None:
        return system, None
    return m.group(1) + system[m.end():], m.group(0)


def parse(body: Any, *, count_only: bool = False) -> ChatRequest:
    require(isinstance(body, dict), "request body must be a JSON object")
    model = body.get("model")
    require(isinstance(model, str) and bool(model), "model: Field required", "model")
    raw = body.get("messages")
    require(isinstance(raw, list), "messages: Field required (a list of messages)", "messages")
    max_tokens = body.get("max_tokens")
    if not count_only:
        require(isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1,
                "max_tokens: Field required (an integer >= 1)", "max_tokens")
    messages: list[Message] = []
    system, normalized = body.get("system"), {}
    if system:
        text = content_text(system, where="system")
        text, billing = normalize_billing_header(text)
        if billing is not None:
            normalized["billing_header"] = billing
        messages.append(Message("system", text))
    for i, m in enumerate(raw):
        messages += _message(m, f"messages[{i}]")
    require(any(m.role != "system" for m in messages), "messages: at least one user message is required", "messages")
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        require(isinstance(t, dict) and isinstance(t.get("name"), str), f"tools[{i}]: needs a name", f"tools[{i}]")
        if "input_schema" not in t:  # server tools (web_search_...) run at Anthropic, not in the model
            continue
        tools.append(ToolSpec(t["name"], t.get("description", "") or "", t["input_schema"] or {}))
    stop = body.get("stop_sequences") or []
    require(isinstance(stop, list) and all(isinstance(s, str) for s in stop), "stop_sequences must be a list of strings")
    return ChatRequest(
        protocol=PROTOCOL, model=model, messages=messages, tools=tools, max_tokens=max_tokens,
        stream=bool(body.get("stream", False)), temperature=number(body, "temperature"), top_p=number(body, "top_p"),
        top_k=body.get("top_k") if isinstance(body.get("top_k"), int) else None, stop=stop,
        tool_choice=body.get("tool_choice"), normalized=normalized,
    )


def _message(m: Any, where: str) -> list[Message]:
    require(isinstance(m, dict), f"{where} must be an object", where)
    role, content = m.get("role"), m.get("content")
    require(role in ("user", "assistant", "system"), f"{where}.role: Unexpected role {role!r}", f"{where}.role")
    require(isinstance(content, (str, list)), f"{where}.content: Field required", f"{where}.content")
    if role == "system":
        return [Message("system", content_text(content, where=f"{where}.content"))]
    if isinstance(content, str):
        return [Message(role, content)]
    if role == "assistant":
        text, calls, reasoning = [], [], []
        for j, b in enumerate(content):
            require(isinstance(b, dict), f"{where}.content[{j}] must be an object", where)
            t = b.get("type")
            if t == "text":
                text.append(b.get("text", ""))
            elif t == "tool_use":
                require(isinstance(b.get("name"), str), f"{where}.content[{j}].name: Field required", where)
                calls.append(ToolCall(b["name"], b.get("input") if b.get("input") is not None else {}, b.get("id", "")))
            elif t == "thinking":
                reasoning.append(b.get("thinking", ""))
        return [Message("assistant", "".join(text), calls, "\n".join(reasoning))]
    # user: tool results become tool messages, in order; text around them stays user text
    out: list[Message] = []
    text: list[str] = []
    for j, b in enumerate(content):
        require(isinstance(b, dict), f"{where}.content[{j}] must be an object", where)
        if b.get("type") == "tool_result":
            if text:
                out.append(Message("user", "".join(text)))
                text = []
            out.append(Message("tool", content_text(b.get("content"), where=f"{where}.content[{j}].content"),
                               tool_call_id=str(b.get("tool_use_id", ""))))
        else:
            text.append(content_text([b], where=f"{where}.content"))
    if text or not out:
        out.append(Message("user", "".join(text)))
    return out


def _blocks(turn: Turn) -> list[dict]:
    blocks: list[dict] = []
    if turn.reasoning:
        blocks.append({"type": "thinking", "thinking": turn.reasoning, "signature": ""})
    if turn.text or not turn.tool_calls:
        blocks.append({"type": "text", "text": turn.text})
    for c in turn.tool_calls:
        blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
    return blocks


def _stop_reason(turn: Turn) -> str:
    if turn.stop_sequence is not None:
        return "stop_sequence"
    return {"tool_calls": "tool_use", "length": "max_tokens"}.get(turn.finish_reason, "end_turn")


def assign_ids(turn: Turn) -> None:
    for c in turn.tool_calls:
        c.id = new_id("toolu_")


def _usage(turn: Turn) -> dict:
    return {"input_tokens": turn.prompt_tokens, "output_tokens": turn.output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def response(turn: Turn, req: ChatRequest, msg_id: str) -> dict:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": req.model, "content": _blocks(turn),
            "stop_reason": _stop_reason(turn), "stop_sequence": turn.stop_sequence, "usage": _usage(turn)}


def count_tokens_response(n: int) -> dict:
    return {"input_tokens": n}


class Stream:
    """Buffered pseudo-streaming: `start` at once, `ping` while generating, `finish` with the whole turn."""

    def __init__(self, req: ChatRequest, msg_id: str, prompt_tokens: int):
        self.req, self.id, self.prompt_tokens = req, msg_id, prompt_tokens

    def start(self) -> bytes:
        msg = {"id": self.id, "type": "message", "role": "assistant", "model": self.req.model, "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 1,
                         "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        return sse({"type": "message_start", "message": msg}, "message_start") + self.ping()

    def ping(self) -> bytes:
        return sse({"type": "ping"}, "ping")

    def finish(self, turn: Turn) -> bytes:
        out = []
        for i, b in enumerate(_blocks(turn)):
            if b["type"] == "text":
                start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": b["text"]}
            elif b["type"] == "thinking":
                start, delta = {"type": "thinking", "thinking": "", "signature": ""}, {"type": "thinking_delta", "thinking": b["thinking"]}
            else:
                start = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
                delta = {"type": "input_json_delta", "partial_json": orjson.dumps(b["input"]).decode()}
            out.append(sse({"type": "content_block_start", "index": i, "content_block": start}, "content_block_start"))
            out.append(sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta"))
            out.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
        out.append(sse({"type": "message_delta", "delta": {"stop_reason": _stop_reason(turn), "stop_sequence": turn.stop_sequence},
                        "usage": {"output_tokens": turn.output_tokens}}, "message_delta"))
        out.append(sse({"type": "message_stop"}, "message_stop"))
        return b"".join(out)

    def error(self, kind: str, message: str) -> bytes:
        _, body = error(kind, message)
        return sse(body, "error")
