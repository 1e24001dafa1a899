"""A rollout's normalized transcript: built from the proxy's view of its calls or the harness's own output.

The transcript (`artifacts.Transcript`: user messages, assistant turns with their tool calls and
arguments, tool results, the final answer) is what graders and the rubric judge read to see what
the agent did, and it is saved per rollout in transcripts.jsonl (docs/architecture.md).

Builders:

- `from_proxy`: from the proxy's conversation log (`GET /admin/rollouts/{id}/conversation`), which
  every harness produces: each call's new request messages and the model's parsed answer. Only the
  main agent's calls count: those offering the tools of the first call that offers any (a title
  call offers none; a subagent has its own tool set, the rule `harnesses.base.classify_by_tools`
  uses). The assistant turns are the model's own answers, not the harness's echo of them.
- `from_claude_stream`: Claude Code's `--output-format stream-json` lines (its subagents' lines,
  marked with a `parent_tool_use_id`, left out); `from_codex_events`: Codex's `exec --json` items.
  Adapters use these when the proxy's log is empty (a proxy without the conversation route).

`pinchbench_events` renders a transcript as the OpenClaw session events PinchBench's `grade()`
functions read (docs/tasks.md): `{"type": "message", "message": {"role": ..., "content": [...]}}`
with `toolCall` parts (`name`, `arguments`) and `toolResult` messages.
"""

from __future__ import annotations

from typing import Any, Callable

from clawgym.artifacts import Transcript, TranscriptMessage, TranscriptToolCall


def _norm_id(call_id: str) -> str:
    """Tool-call ids compared loosely: OpenClaw rewrites them (drops `_`) before sending them back."""
    return "".join(ch for ch in call_id if ch.isalnum())


def final_answer(messages: list[TranscriptMessage]) -> str | None:
    """The text of the last assistant turn when that turn called no tools, else None."""
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    return last.text if last is not None and not last.tool_calls else None


def _with_tool_names(messages: list[TranscriptMessage]) -> list[TranscriptMessage]:
    names = {_norm_id(c.id): c.name for m in messages for c in m.tool_calls if c.id}
    for m in messages:
        if m.role == "tool" and not m.tool_name:
            m.tool_name = names.get(_norm_id(m.tool_call_id), "")
    return messages


def from_proxy(calls: list[dict], source: str = "proxy") -> Transcript:
    """The main agent's conversation from the proxy's per-call log (see the module docstring)."""
    main = next((c["tools"] for c in calls if c.get("tools")), [])
    out: list[TranscriptMessage] = []
    for c in sorted(calls, key=lambda c: c["seq"]):
        if c.get("tools", []) != main:
            continue
        for m in c.get("messages", []):
            if m.get("role") == "tool":
                out.append(TranscriptMessage("tool", str(m.get("content", "")), tool_call_id=str(m.get("tool_call_id", ""))))
            elif m.get("role") == "user":
                out.append(TranscriptMessage("user", str(m.get("content", ""))))
        o = c.get("output")
        if o is not None:
            tcs = [TranscriptToolCall(str(t.get("id", "")), str(t.get("name", "")), t.get("arguments")) for t in o.get("tool_calls", [])]
            out.append(TranscriptMessage("assistant", str(o.get("text", "")), tcs, reasoning=str(o.get("reasoning", ""))))
    out = _with_tool_names(out)
    return Transcript(source=source if out else "none", final_answer=final_answer(out), messages=out)


def _block_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def from_claude_stream(events: list[dict]) -> Transcript:
    """Claude Code's stream-json events -> its main agent's transcript (the prompt is not among them)."""
    out: list[TranscriptMessage] = []
    for ev in events:
        msg = ev.get("message")
        if ev.get("type") not in ("assistant", "user") or not isinstance(msg, dict) or ev.get("parent_tool_use_id"):
            continue
        content = msg.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
        blocks = [b for b in blocks if isinstance(b, dict)]
        if ev["type"] == "assistant":
            text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            thinking = "".join(str(b.get("thinking", "")) for b in blocks if b.get("type") == "thinking")
            tcs = [TranscriptToolCall(str(b.get("id", "")), str(b.get("name", "")), b.get("input", {}))
                   for b in blocks if b.get("type") == "tool_use"]
            out.append(TranscriptMessage("assistant", text, tcs, reasoning=thinking))
            continue
        for b in blocks:
            if b.get("type") == "tool_result":
                out.append(TranscriptMessage("tool", _block_text(b.get("content")), tool_call_id=str(b.get("tool_use_id", ""))))
            elif b.get("type") == "text":
                out.append(TranscriptMessage("user", str(b.get("text", ""))))
    out = _with_tool_names(out)
    return Transcript(source="claude-code-stream-json" if out else "none", final_answer=final_answer(out), messages=out)


def from_codex_events(events: list[dict]) -> Transcript:
    """Codex's `exec --json` events -> a transcript: each command run is a tool call with its output,
    each agent message an assistant turn. Codex does not print the model's tool names, so command
    runs are named `exec_command` (its shell tool), file edits `apply_patch`."""
    out: list[TranscriptMessage] = []
    for ev in events:
        item = ev.get("item")
        if ev.get("type") != "item.completed" or not isinstance(item, dict):
            continue
        kind, iid = item.get("type"), str(item.get("id", ""))
        if kind == "agent_message":
            out.append(TranscriptMessage("assistant", str(item.get("text", ""))))
        elif kind == "reasoning":
            out.append(TranscriptMessage("assistant", "", reasoning=str(item.get("text", ""))))
        elif kind == "command_execution":
            out.append(TranscriptMessage("assistant", "", [TranscriptToolCall(iid, "exec_command", {"command": str(item.get("command", ""))})]))
            out.append(TranscriptMessage("tool", str(item.get("aggregated_output", "")), tool_call_id=iid, tool_name="exec_command"))
        elif kind == "file_change":
            out.append(TranscriptMessage("assistant", "", [TranscriptToolCall(iid, "apply_patch", {"changes": item.get("changes", [])})]))
            out.append(TranscriptMessage("tool", str(item.get("status", "")), tool_call_id=iid, tool_name="apply_patch"))
    return Transcript(source="codex-json" if out else "none", final_answer=final_answer(out), messages=out)


def proxy_or(calls: list[dict], own: Callable[[], Transcript]) -> Transcript:
    """The proxy's transcript when it holds any message, else the one from the harness's own output."""
    t = from_proxy(calls)
    return t if t.messages else own()


def pinchbench_events(t: Transcript) -> list[dict]:
    """The transcript as OpenClaw session events, the list PinchBench's grade(transcript, workspace) reads."""
    events = []
    for m in t.messages:
        if m.role == "tool":
            msg = {"role": "toolResult", "toolCallId": m.tool_call_id, "toolName": m.tool_name,
                   "content": [{"type": "text", "text": m.text}]}
        else:
            content: list[dict] = []
            if m.reasoning:
                content.append({"type": "thinking", "thinking": m.reasoning})
            if m.text:
                content.append({"type": "text", "text": m.text})
            for c in m.tool_calls:  # graders call arguments.get(...): a non-object is wrapped
                args = c.arguments if isinstance(c.arguments, dict) else {"input": c.arguments}
                content.append({"type": "toolCall", "id": c.id, "name": c.name, "arguments": args})
            msg = {"role": m.role, "content": content}
        events.append({"type": "message", "message": msg})
    return events
