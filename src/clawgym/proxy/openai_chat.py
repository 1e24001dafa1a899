"""OpenAI Chat Completions (`POST /v1/chat/completions`): what OpenClaw and most agents speak.

Reads `tools`, `tool_choice`, `max_completion_tokens` (or the older `max_tokens`),
`stream_options.include_usage`; tool results arrive as `role:"tool"` messages whose ids the
harness may have rewritten (OpenClaw strips `_`), which is fine: the proxy never looks anything up
by tool-call id. Streams are `data:` chunks ending with `data: [DONE]`; keep-alive pings are SSE
comments, which every SSE client ignores.
"""

from __future__ import annotations

import time
from typing import Any

from clawgym.proxy.types import (ChatRequest, Message, ProtocolError, ToolCall, ToolSpec, Turn, content_text, fold_system,
                                 new_id, parse_arguments, number, require, sse)

PROTOCOL = "openai-chat"

# ProtocolError.kind -> (HTTP status, OpenAI error type, code)
ERRORS = {
    "invalid_request": (400, "invalid_request_error", None),
    "context_length": (400, "invalid_request_error", "context_length_exceeded"),
    "call_budget": (400, "invalid_request_error", "call_budget_exhausted"),
    "authentication": (401, "invalid_request_error", "invalid_api_key"),
    "permission": (403, "invalid_request_error", "permission_denied"),
    "not_found": (404, "invalid_request_error", "not_found"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "overloaded": (503, "server_error", "overloaded"),
    "internal": (500, "server_error", None),
}


def error(kind: str, message: str, param: str | None = None) -> tuple[int, dict]:
    status, etype, code = ERRORS.get(kind, ERRORS["internal"])
    return status, {"error": {"message": message, "type": etype, "param": param, "code": code}}


def context_error(n_prompt: int, window: int) -> ProtocolError:
    return ProtocolError("context_length", f"This model's maximum context length is {window} tokens. However, your "
                                           f"messages resulted in {n_prompt} tokens. Please reduce the length of the messages.",
                         "messages")


def parse(body: Any) -> ChatRequest:
    require(isinstance(body, dict), "request body must be a JSON object")
    model = body.get("model")
    require(isinstance(model, str) and bool(model), "you must provide a model parameter", "model")
    raw = body.get("messages")
    require(isinstance(raw, list) and len(raw) > 0, "'messages' is a required property (a non-empty list)", "messages")
    messages = fold_system([_message(m, f"messages[{i}]") for i, m in enumerate(raw)])
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        require(isinstance(t, dict), f"tools[{i}] must be an object", f"tools[{i}]")
        if t.get("type", "function") != "function":
            continue
        fn = t.get("function")
        require(isinstance(fn, dict) and isinstance(fn.get("name"), str), f"tools[{i}].function.name is required",
                f"tools[{i}].function.name")
        tools.append(ToolSpec(fn["name"], fn.get("description", "") or "", fn.get("parameters") or {"type": "object", "properties": {}}))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    require(max_tokens is None or (isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1),
            "max_completion_tokens must be an integer >= 1", "max_completion_tokens")
    n = body.get("n", 1)
    require(n in (None, 1), "n > 1 is not supported by this proxy; send separate requests", "n")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    require(isinstance(stop, list) and all(isinstance(s, str) for s in stop), "stop must be a string or a list of strings", "stop")
    opts = body.get("stream_options") or {}
    return ChatRequest(
        protocol=PROTOCOL, model=model, messages=messages, tools=tools, max_tokens=max_tokens,
        stream=bool(body.get("stream", False)), temperature=number(body, "temperature"), top_p=number(body, "top_p"),
        seed=body.get("seed") if isinstance(body.get("seed"), int) else None, stop=stop,
        tool_choice=body.get("tool_choice"), include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
    )


def _message(m: Any, where: str) -> Message:
    require(isinstance(m, dict), f"{where} must be an object", where)
    role = m.get("role")
    require(role in ("system", "developer", "user", "assistant", "tool", "function"),
            f"{where}.role: unknown role {role!r}", f"{where}.role")
    content = content_text(m.get("content"), where=f"{where}.content")
    if role in ("system", "developer"):
        return Message("system", content)
    if role in ("tool", "function"):
        return Message("tool", content, tool_call_id=str(m.get("tool_call_id", m.get("name", ""))))
    if role == "user":
        require(m.get("content") is not None, f"{where}.content is required", f"{where}.content")
        return Message("user", content)
    calls = []
    for j, c in enumerate(m.get("tool_calls") or []):
        fn = c.get("function") if isinstance(c, dict) else None
        require(isinstance(fn, dict) and isinstance(fn.get("name"), str), f"{where}.tool_calls[{j}].function.name is required",
                f"{where}.tool_calls[{j}]")
        calls.append(ToolCall(fn["name"], parse_arguments(fn.get("arguments", "{}")), str(c.get("id", ""))))
    reasoning = m.get("reasoning_content") or m.get("reasoning") or ""
    return Message("assistant", content, calls, reasoning if isinstance(reasoning, str) else "")


def assign_ids(turn: Turn) -> None:
    for c in turn.tool_calls:
        c.id = new_id("call_")


def _finish(turn: Turn) -> str:
    return turn.finish_reason if turn.finish_reason in ("tool_calls", "length") else "stop"


def _usage(turn: Turn) -> dict:
    return {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.output_tokens,
            "total_tokens": turn.prompt_tokens + turn.output_tokens}


def _tool_calls(turn: Turn) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}}
            for c in turn.tool_calls]


def response(turn: Turn, req: ChatRequest, resp_id: str) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": turn.text if (turn.text or not turn.tool_calls) else None}
    if turn.tool_calls:
        msg["tool_calls"] = _tool_calls(turn)
    if turn.reasoning:
        msg["reasoning_content"] = turn.reasoning
    return {"id": resp_id, "object": "chat.completion", "created": int(time.time()), "model": req.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": _finish(turn), "logprobs": None}],
            "usage": _usage(turn)}


class Stream:
    """Buffered pseudo-streaming for chat completions (see anthropic.Stream)."""

    def __init__(self, req: ChatRequest, resp_id: str, prompt_tokens: int):
        self.req, self.id, self.prompt_tokens = req, resp_id, prompt_tokens
        self.created = int(time.time())

    def _chunk(self, delta: dict, finish: str | None = None) -> bytes:
        return sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.req.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def ping(self) -> bytes:
        return b": ping\n\n"

    def finish(self, turn: Turn) -> bytes:
        out = []
        if turn.reasoning:
            out.append(self._chunk({"reasoning_content": turn.reasoning}))
        if turn.text:
            out.append(self._chunk({"content": turn.text}))
        for i, c in enumerate(_tool_calls(turn)):
            out.append(self._chunk({"tool_calls": [{"index": i, **c}]}))
        out.append(self._chunk({}, _finish(turn)))
        if self.req.include_usage:
            out.append(sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                            "model": self.req.model, "choices": [], "usage": _usage(turn)}))
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)

    def error(self, kind: str, message: str) -> bytes:
        _, body = error(kind, message)
        return sse(body) + b"data: [DONE]\n\n"
