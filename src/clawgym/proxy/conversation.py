"""What each call of a rollout said and answered, for the rollout's transcript (docs/architecture.md).

The records hold tokens; a grader or a judge needs the conversation: which tools the agent called
with which arguments, what they returned, what it finally said. The proxy parses every request
into protocol-neutral messages anyway (`types.ChatRequest`) and every answer into a `Turn`, so it
keeps, per call, the request's messages that this rollout had not sent before in a call offering
the same tools (a harness re-sends the whole conversation each turn: storing only the new ones
keeps memory linear in the conversation, not quadratic), and the parsed answer. Calls are grouped
by their tool set because a title call or a subagent has its own conversation; the runner's
transcript builder (`clawgym.rollout.transcript`) picks the main agent's.

System messages are left out (they are the harness's configuration, often tens of thousands of
tokens) and so are the assistant turns a harness echoes back (the proxy has the model's own answer).
Each call also keeps the text of its request's last user message (`last_user`), whether sent before
or not: what a harness adapter reads to tell a compaction or a title call from the agent's own
(`classify`, docs/harnesses.md), whatever chat template renders the prompt.
Served as JSON by `GET /admin/rollouts/{id}/conversation`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import orjson

from clawgym.proxy.types import ChatRequest, Message, ToolCall, Turn


def _call_json(c: ToolCall) -> dict:
    return {"id": c.id, "name": c.qualified_name, "arguments": c.arguments}


def _message_json(m: Message) -> dict:
    d: dict = {"role": m.role, "content": m.content}
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    return d


@dataclass
class ConversationLog:
    """Per rollout: each call's new messages and its answer (see the module docstring)."""

    calls: dict[str, dict] = field(default_factory=dict)
    """call id -> {seq, tools, messages, last_user, output}; insertion order is arrival order"""
    _seen: dict[tuple[str, ...], set[bytes]] = field(default_factory=dict)

    def add_request(self, call_id: str, seq: int, req: ChatRequest) -> None:
        tools = tuple(sorted(t.qualified_name for t in req.tools))
        seen = self._seen.setdefault(tools, set())
        new = []
        for m in req.messages:
            if m.role in ("system", "assistant"):
                continue
            d = _message_json(m)
            key = hashlib.blake2b(orjson.dumps(d, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()
            if key not in seen:
                seen.add(key)
                new.append(d)
        last_user = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
        self.calls[call_id] = {"seq": seq, "tools": list(tools), "messages": new, "last_user": last_user, "output": None}

    def add_output(self, call_id: str, turn: Turn) -> None:
        if call_id in self.calls:
            self.calls[call_id]["output"] = {"text": turn.text, "reasoning": turn.reasoning,
                                             "tool_calls": [_call_json(c) for c in turn.tool_calls]}

    def to_json(self) -> list[dict]:
        return sorted(self.calls.values(), key=lambda c: c["seq"])
