"""OpenAI Responses (`POST /v1/responses`): what Codex speaks (it accepts no other wire API).

Input items: `message` (roles developer/system/user/assistant; input_text/output_text parts),
`function_call`, `function_call_output`, `custom_tool_call`, `custom_tool_call_output`,
`reasoning`. Consecutive assistant-side items (reasoning, an assistant message, tool calls) form one
assistant turn — the way the proxy emitted them. Tools: `function`; `namespace` (its functions are
offered as `namespace.name` and answered with a `namespace` field); `custom` (freeform: offered as a
function with one `input` string, answered as `custom_tool_call`); hosted tools (`web_search`, ...)
are dropped since no local model runs them. `store` is accepted but nothing is stored, so
`previous_response_id` is refused with a message saying to send the full input.
"""

from __future__ import annotations

import time
from typing import Any

from clawgym.proxy.types import (ChatRequest, Message, ProtocolError, ToolCall, ToolSpec, Turn, content_text, fold_system,
                                 new_id, number, parse_arguments, require, sse)
from clawgym.proxy import openai_chat

PROTOCOL = "openai-responses"
ERRORS = openai_chat.ERRORS
error = openai_chat.error
assign_ids = openai_chat.assign_ids  # call_ ids, as Chat Completions


def context_error(n_prompt: int, window: int) -> ProtocolError:
    return ProtocolError("context_length", f"Your input exceeds the context window of this model: {n_prompt} tokens "
                                           f"for a window of {window}. Please adjust your input and try again.", "input")


def _tools(raw: Any) -> list[ToolSpec]:
    out: list[ToolSpec] = []
    require(raw is None or isinstance(raw, list), "tools must be a list", "tools")
    for i, t in enumerate(raw or []):
        require(isinstance(t, dict), f"tools[{i}] must be an object", f"tools[{i}]")
        kind = t.get("type")
        if kind == "namespace":
            for sub in _tools(t.get("tools") or []):
                sub.namespace = str(t.get("name", ""))
                out.append(sub)
        elif kind == "function":
            require(isinstance(t.get("name"), str), f"tools[{i}].name is required", f"tools[{i}].name")
            out.append(ToolSpec(t["name"], t.get("description", "") or "", t.get("parameters") or {"type": "object", "properties": {}}))
        elif kind == "custom":
            require(isinstance(t.get("name"), str), f"tools[{i}].name is required", f"tools[{i}].name")
            fmt = t.get("format") or {}
            hint = f" Input format ({fmt.get('syntax', 'text')}):\n{fmt.get('definition', '')}" if fmt.get("definition") else ""
            out.append(ToolSpec(t["name"], t.get("description", "") or "", {
                "type": "object", "properties": {"input": {"type": "string", "description": "freeform input." + hint}},
                "required": ["input"]}, kind="custom"))
    return out


def parse(body: Any) -> ChatRequest:
    require(isinstance(body, dict), "request body must be a JSON object")
    model = body.get("model")
    require(isinstance(model, str) and bool(model), "Missing required parameter: 'model'.", "model")
    require(not body.get("previous_response_id"),
            "previous_response_id is not supported: this proxy keeps no server state (store:false); send the full input",
            "previous_response_id")
    raw = body.get("input")
    require(isinstance(raw, (str, list)) and len(raw) > 0, "Missing required parameter: 'input'.", "input")
    messages: list[Message] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append(Message("system", body["instructions"]))
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw
    turn: Message | None = None  # the assistant turn being assembled from consecutive items
    for i, it in enumerate(items):
        where = f"input[{i}]"
        require(isinstance(it, dict), f"{where} must be an object", where)
        kind = it.get("type", "message")
        role = it.get("role")
        if kind in ("function_call", "custom_tool_call", "reasoning") or (kind == "message" and role == "assistant"):
            if turn is None:
                turn = Message("assistant")
                messages.append(turn)
            if kind == "function_call":
                require(isinstance(it.get("name"), str), f"{where}.name is required", f"{where}.name")
                turn.tool_calls.append(ToolCall(it["name"], parse_arguments(it.get("arguments", "{}")), str(it.get("call_id", "")),
                                                namespace=str(it.get("namespace") or "")))
            elif kind == "custom_tool_call":
                require(isinstance(it.get("name"), str), f"{where}.name is required", f"{where}.name")
                turn.tool_calls.append(ToolCall(it["name"], {"input": str(it.get("input", ""))}, str(it.get("call_id", "")),
                                                kind="custom", namespace=str(it.get("namespace") or "")))
            elif kind == "reasoning":
                parts = (it.get("summary") or []) + (it.get("content") or [])
                turn.reasoning += "".join(p.get("text", "") for p in parts if isinstance(p, dict))
            else:
                turn.content += content_text(it.get("content"), where=f"{where}.content")
            continue
        turn = None
        if kind == "message":
            require(role in ("user", "system", "developer"), f"{where}.role: unknown role {role!r}", f"{where}.role")
            text = content_text(it.get("content"), where=f"{where}.content")
            messages.append(Message("system" if role in ("system", "developer") else "user", text))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            out = it.get("output", "")
            messages.append(Message("tool", out if isinstance(out, str) else content_text(out, where=f"{where}.output"),
                                    tool_call_id=str(it.get("call_id", ""))))
        # item_reference, web_search_call, ...: nothing a local model can use
    require(any(m.role != "system" for m in messages), "input must hold at least one user message", "input")
    max_tokens = body.get("max_output_tokens")
    require(max_tokens is None or (isinstance(max_tokens, int) and max_tokens >= 1), "max_output_tokens must be an integer >= 1",
            "max_output_tokens")
    return ChatRequest(
        protocol=PROTOCOL, model=model, messages=fold_system(messages), tools=_tools(body.get("tools")), max_tokens=max_tokens,
        stream=bool(body.get("stream", False)), temperature=number(body, "temperature"),
        top_p=number(body, "top_p"), tool_choice=body.get("tool_choice"),
        extra={"tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
               "parallel_tool_calls": body.get("parallel_tool_calls", True), "reasoning": body.get("reasoning"),
               "max_output_tokens": max_tokens, "metadata": body.get("metadata") or {}},
    )


def _items(turn: Turn, req: ChatRequest, done: bool) -> list[dict]:
    status = "completed" if done else "in_progress"
    items: list[dict] = []
    if turn.reasoning:
        items.append({"type": "reasoning", "id": new_id("rs_"), "summary": [{"type": "summary_text", "text": turn.reasoning}]})
    if turn.text or not turn.tool_calls:
        items.append({"type": "message", "id": new_id("msg_"), "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": turn.text, "annotations": [], "logprobs": []}]})
    for c in turn.tool_calls:
        spec = req.tool_by_name(c.qualified_name)
        name, ns = (spec.name, spec.namespace) if spec else (c.name, "")
        if spec is not None and spec.kind == "custom":
            arg = c.arguments.get("input", "") if isinstance(c.arguments, dict) else c.arguments
            item = {"type": "custom_tool_call", "id": new_id("ctc_"), "call_id": c.id, "name": name,
                    "input": arg if isinstance(arg, str) else str(arg), "status": status}
        else:
            item = {"type": "function_call", "id": new_id("fc_"), "call_id": c.id, "name": name,
                    "arguments": c.arguments_json(), "status": status}
        if ns:
            item["namespace"] = ns
        items.append(item)
    return items


def _response(req: ChatRequest, resp_id: str, created: int, status: str, output: list[dict], turn: Turn | None) -> dict:
    x = req.extra
    usage = None
    if turn is not None:
        usage = {"input_tokens": turn.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": turn.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": turn.prompt_tokens + turn.output_tokens}
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": resp_id, "object": "response", "created_at": created, "status": status, "error": None,
            "incomplete_details": incomplete, "instructions": None, "max_output_tokens": x.get("max_output_tokens"),
            "model": req.model, "output": output, "parallel_tool_calls": x.get("parallel_tool_calls", True),
            "previous_response_id": None, "reasoning": x.get("reasoning"), "store": False,
            "temperature": req.temperature, "top_p": req.top_p, "text": {"format": {"type": "text"}},
            "tool_choice": x.get("tool_choice", "auto"), "tools": x.get("tools", []), "truncation": "disabled",
            "usage": usage, "metadata": x.get("metadata", {})}


def _status(turn: Turn) -> str:
    return "incomplete" if turn.finish_reason == "length" else "completed"


def response(turn: Turn, req: ChatRequest, resp_id: str) -> dict:
    return _response(req, "resp_" + resp_id, int(time.time()), _status(turn), _items(turn, req, True), turn)


class Stream:
    """Buffered pseudo-streaming for Responses: created/in_progress at once, the items when done."""

    def __init__(self, req: ChatRequest, resp_id: str, prompt_tokens: int):
        self.req, self.id, self.created, self.seq = req, "resp_" + resp_id, int(time.time()), 0

    def _ev(self, data: dict) -> bytes:
        data["sequence_number"] = self.seq
        self.seq += 1
        return sse(data, data["type"])

    def start(self) -> bytes:
        r = _response(self.req, self.id, self.created, "in_progress", [], None)
        return self._ev({"type": "response.created", "response": r}) + self._ev({"type": "response.in_progress", "response": r})

    def ping(self) -> bytes:
        return b": ping\n\n"

    def finish(self, turn: Turn) -> bytes:
        out, items = [], _items(turn, self.req, True)
        for idx, item in enumerate(items):
            added = dict(item, status="in_progress") if "status" in item else dict(item)
            if item["type"] == "message":
                added["content"] = []
            elif item["type"] == "function_call":
                added["arguments"] = ""
            elif item["type"] == "custom_tool_call":
                added["input"] = ""
            out.append(self._ev({"type": "response.output_item.added", "output_index": idx, "item": added}))
            base = {"item_id": item["id"], "output_index": idx}
            if item["type"] == "message":
                text = item["content"][0]["text"]
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out.append(self._ev({"type": "response.content_part.added", **base, "content_index": 0, "part": part}))
                out.append(self._ev({"type": "response.output_text.delta", **base, "content_index": 0, "delta": text, "logprobs": []}))
                out.append(self._ev({"type": "response.output_text.done", **base, "content_index": 0, "text": text, "logprobs": []}))
                out.append(self._ev({"type": "response.content_part.done", **base, "content_index": 0, "part": dict(part, text=text)}))
            elif item["type"] == "function_call":
                out.append(self._ev({"type": "response.function_call_arguments.delta", **base, "delta": item["arguments"]}))
                out.append(self._ev({"type": "response.function_call_arguments.done", **base, "arguments": item["arguments"],
                                     "name": item["name"]}))
            elif item["type"] == "custom_tool_call":
                out.append(self._ev({"type": "response.custom_tool_call_input.delta", **base, "delta": item["input"]}))
                out.append(self._ev({"type": "response.custom_tool_call_input.done", **base, "input": item["input"]}))
            out.append(self._ev({"type": "response.output_item.done", "output_index": idx, "item": item}))
        status = _status(turn)
        final = _response(self.req, self.id, self.created, status, items, turn)
        out.append(self._ev({"type": f"response.{status}", "response": final}))
        return b"".join(out)

    def error(self, kind: str, message: str) -> bytes:
        _, body = error(kind, message)
        r = _response(self.req, self.id, self.created, "failed", [], None)
        r["error"] = {"code": "server_is_overloaded" if kind == "overloaded" else "server_error", "message": message}
        return self._ev({"type": "response.failed", "response": r})
