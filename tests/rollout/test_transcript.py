"""Transcripts: graders and the judge see what the agent did.

End to end through the real runner, proxy (scripted engine), sandbox and agentloop process, on
PinchBench-style tasks imported by the real importer: a criterion that reads the transcript scores
1 only when the agent really read the notes; the fake judge (a stand-in for an outside LLM) gets the
agent's actions; transcripts.jsonl is saved with its schema and shown by `clawgym inspect`.
"""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest
from rich.console import Console
from helpers import script, tool_call
from test_verifier import FakeJudge

from clawgym import artifacts as A
from clawgym.errors import UserError
from clawgym.run.inspection import inspect_path
from clawgym.rollout.runner import RolloutConfig, run_rollouts
from clawgym.rollout.verifier import VerifierConfig
from clawgym.tasks.importers import import_tasks

# A memory task in PinchBench's format: its grader loops over the transcript as PinchBench's own do.
MEMORY_TASK = '''---
id: task_notes_recall
name: Recall from notes
category: memory
grading_type: hybrid
grading_weights:
  automated: 0.5
  llm_judge: 0.5
timeout_seconds: 60
workspace_files:
  - path: notes.md
    content: "The launch code is PURPLE-42."
---

## Prompt

Read notes.md, then write the launch code to answer.txt.

## Automated Checks

```python
def grade(transcript: list, workspace_path: str) -> dict:
    from pathlib import Path
    read_notes = False
    for event in transcript:
        if event.get("type") != "message":
            continue
        msg = event.get("message", {})
        if msg.get("role") == "assistant":
            for item in msg.get("content", []):
                if item.get("type") == "toolCall" and item.get("name", "").lower() in ("read", "read_file"):
                    params = item.get("params", item.get("arguments", {}))
                    if "notes.md" in str(params.get("path", params.get("file_path", ""))):
                        read_notes = True
    answer = Path(workspace_path) / "answer.txt"
    return {"read_notes": 1.0 if read_notes else 0.0,
            "answer": 1.0 if answer.exists() and "PURPLE-42" in answer.read_text() else 0.0}
```

## LLM Judge Rubric

### Criterion 1: Process
Did the agent look the code up in the notes rather than guess it?
**Score 1.0**: yes
**Score 0.0**: no
'''

# PinchBench's sanity task, grader verbatim: it passes on any assistant response in the transcript.
SANITY_TASK = '''---
id: task_sanity
name: Sanity Check
category: productivity
grading_type: automated
timeout_seconds: 60
workspace_files: []
---

## Prompt

Say "Hello, I'm ready!" to confirm you can respond.

## Automated Checks

```python
def grade(transcript: list, workspace_path: str) -> dict:
    scores = {}
    has_response = False
    for entry in transcript:
        if entry.get("type") == "message":
            message = entry.get("message", {})
            if message.get("role") == "assistant":
                content = message.get("content", [])
                if content and len(content) > 0:
                    has_response = True
                    break
    scores["agent_responded"] = 1.0 if has_response else 0.0
    return scores
```
'''


def _tasks(tmp_path: Path) -> Path:
    src = tmp_path / "pb" / "tasks"
    src.mkdir(parents=True)
    (src / "task_notes_recall.md").write_text(MEMORY_TASK)
    (src / "task_sanity.md").write_text(SANITY_TASK)
    report = import_tasks("pinchbench", src.parent, tmp_path / "tasks")
    assert report.skipped == [] and len(report.imported) == 2
    return tmp_path / "tasks"


@pytest.mark.slow
def test_transcript_criteria_and_the_judge_see_what_the_agent_did(tmp_path: Path, tiny_model: Path) -> None:
    tasks = _tasks(tmp_path)
    s = script(tmp_path / "script.jsonl", {
        "task_notes_recall.agentloop.0": [tool_call("read", path="notes.md"),  # looks it up, then answers
                                          tool_call("write", path="answer.txt", content="PURPLE-42"), "Done."],
        "task_notes_recall.agentloop.1": [tool_call("write", path="answer.txt", content="PURPLE-42"), "Done."],  # a guess
        "task_sanity.agentloop.0": ["Hello, I'm ready!"],
    })
    judge = FakeJudge(['{"scores": {"criterion_1": 1}, "notes": "ok"}'])
    try:
        cfg = RolloutConfig(tasks=tasks, harnesses=["agentloop"], out=tmp_path / "out", model=tiny_model, group_size=2, concurrency=2,
                            engine="scripted", engine_options={"script": str(s)}, task_filter=["task_notes_recall"],
                            verifier=VerifierConfig(judge=judge.config))
        summary = run_rollouts(cfg)
        sanity = run_rollouts(RolloutConfig(tasks=tasks, harnesses=["agentloop"], out=tmp_path / "out-sanity", model=tiny_model,
                                            engine="scripted", engine_options={"script": str(s)}, task_filter=["task_sanity"]))
    finally:
        judge.close()

    by_id = {r.rollout_id: r for r in summary.rollouts}
    subs = {rid: orjson.loads(r.subscores_json) for rid, r in by_id.items()}
    assert subs["task_notes_recall.agentloop.0"]["code/read_notes"] == 1.0
    assert subs["task_notes_recall.agentloop.1"]["code/read_notes"] == 0.0
    assert all(subs[rid]["code/answer"] == 1.0 for rid in by_id)
    assert by_id["task_notes_recall.agentloop.0"].code_score == 1.0 and by_id["task_notes_recall.agentloop.1"].code_score == 0.5
    assert sanity.rollouts[0].reward == 1.0  # PinchBench's sanity grader finds the assistant's answer

    # the judge got each rollout's actions: the read of the notes and what it returned, or their absence
    prompts = [r["messages"][1]["content"].split("## Transcript", 1)[1].split("## Rubric", 1)[0] for r in judge.requests]
    assert len(prompts) == 2
    read = [p for p in prompts if 'tool call read: {"path": "notes.md"}' in p]
    assert len(read) == 1 and "The launch code is PURPLE-42." in read[0]
    assert all("tool call write" in p and "Done." in p for p in prompts)

    # saved with its schema, one line per rollout, and shown by inspect
    saved = A.read_transcripts(tmp_path / "out" / "transcripts.jsonl")
    t = saved["task_notes_recall.agentloop.0"]
    assert (t.harness, t.source, t.final_answer) == ("agentloop", "proxy", "Done.")
    assert [m.role for m in t.messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert t.messages[0].text.startswith("Read notes.md, then write the launch code")
    call = t.messages[1].tool_calls[0]
    assert (call.name, call.arguments) == ("read", {"path": "notes.md"})
    assert (t.messages[2].tool_name, t.messages[2].tool_call_id, t.messages[2].text) == ("read", call.id, "The launch code is PURPLE-42.")
    first = orjson.loads((tmp_path / "out" / "transcripts.jsonl").read_bytes().splitlines()[0])
    assert (first["schema_version"], first["kind"]) == (A.SCHEMA_VERSION, "transcripts")

    out = io.StringIO()
    inspect_path(tmp_path / "out" / "transcripts.jsonl", Console(file=out, width=200))
    assert "2 rollouts" in out.getvalue() and "read×1" in out.getvalue()
    out = io.StringIO()
    inspect_path(tmp_path / "out" / "transcripts.jsonl", Console(file=out, width=200), rollout="task_notes_recall.agentloop.0")
    assert 'calls read {"path": "notes.md"}' in out.getvalue() and "The launch code is PURPLE-42." in out.getvalue()
    with pytest.raises(UserError, match="no rollout 'nope'"):
        inspect_path(tmp_path / "out" / "transcripts.jsonl", Console(file=io.StringIO()), rollout="nope")


def test_a_damaged_transcripts_file_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "transcripts.jsonl"
    good = A.Transcript("r1", "agentloop", "proxy", "hi", [A.TranscriptMessage("assistant", "hi")]).to_json()
    path.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(good | {"schema_version": 99}) + b"\n")
    with pytest.raises(A.ArtifactError, match="field 'schema_version': is 99"):
        A.read_transcripts(path)
    path.write_bytes(orjson.dumps(good | {"messages": [{"role": "robot"}]}) + b"\n")
    with pytest.raises(A.ArtifactError, match="field 'messages'"):
        A.read_transcripts(path)
    path.write_bytes(orjson.dumps(good) + b"\n")
    assert A.read_transcripts(path)["r1"] == A.Transcript("r1", "agentloop", "proxy", "hi", [A.TranscriptMessage("assistant", "hi")])


# Excerpts of what the real harnesses sent and printed (Claude Code 2.1.197, Codex 0.171.0, OpenClaw
# 2026.9.6 writing out.txt with one shell call): their requests' message shapes, system prompts and
# tool schemas cut down; plus the proxy's answer to each request.
FIXTURES = orjson.loads((Path(__file__).parents[1] / "fixtures" / "harness_transcripts.json").read_bytes())
PROTOCOLS = {"anthropic": "clawgym.proxy.anthropic", "openai-chat": "clawgym.proxy.openai_chat",
             "openai-responses": "clawgym.proxy.openai_responses"}


def _proxy_log(harness: str) -> list[dict]:
    """The proxy's conversation log of the recorded rollout: each request parsed by the real protocol module."""
    import importlib

    from clawgym.proxy.conversation import ConversationLog
    from clawgym.proxy.types import ToolCall, Turn

    fx = FIXTURES[harness]
    proto = importlib.import_module(PROTOCOLS[fx["protocol"]])
    log = ConversationLog()
    for seq, (body, out) in enumerate(zip(fx["requests"], fx["outputs"])):
        log.add_request(f"c{seq}", seq, proto.parse(body))
        calls = [ToolCall(c["name"], c["arguments"], c["id"]) for c in out["tool_calls"]]
        log.add_output(f"c{seq}", Turn(out["text"], calls, "", "tool_calls" if calls else "stop", 10, 5))
    return log.to_json()


@pytest.mark.parametrize("harness,prompt,tool,args,result", [
    ("claude-code", "Create a file out.txt containing hi, using the Bash tool.", "Bash", {"command": "echo hi > out.txt"},
     "(Bash completed with no output)"),
    ("codex", "Create a file out.txt containing hi by running a shell command.", "exec_command", {"cmd": "echo hi > out.txt"},
     "Process exited with code 0"),
    ("openclaw", "Create a file out.txt containing hi by running a shell command.", "exec", {"command": "echo hi > out.txt"},
     "(no output)"),
])
def test_each_adapter_builds_the_transcript_from_the_proxys_view(harness: str, prompt: str, tool: str, args: dict, result: str) -> None:
    from clawgym.rollout.harnesses import HARNESSES
    from clawgym.rollout.transcript import pinchbench_events

    t = HARNESSES[harness]().transcript("", _proxy_log(harness))
    assert t.source == "proxy" and t.final_answer == "Done: wrote out.txt"
    users = [m.text for m in t.messages if m.role == "user"]
    # once: Claude Code's title call (no tools) repeats the prompt but is not the agent's conversation
    assert sum(prompt in u for u in users) == 1 and not any("(cut)" in m.text for m in t.messages)  # system prompts left out
    calls = [c for m in t.messages for c in m.tool_calls]
    assert [(c.name, c.arguments) for c in calls] == [(tool, args)]
    (res,) = [m for m in t.messages if m.role == "tool"]
    assert result in res.text and res.tool_name == tool  # matched to its call (OpenClaw sends the id back without '_')
    roles = [m.role for m in t.messages if m.role != "user"]
    assert roles == ["assistant", "tool", "assistant"]
    events = pinchbench_events(t)
    assert {"type": "toolCall", "id": calls[0].id, "name": tool, "arguments": args} in \
        [c for e in events if e["message"]["role"] == "assistant" for c in e["message"]["content"]]
    assert any(e["message"]["role"] == "toolResult" and e["message"]["toolName"] == tool for e in events)


def test_claude_code_and_codex_fall_back_to_their_own_json_output() -> None:
    from clawgym.rollout.harnesses import HARNESSES

    cc = HARNESSES["claude-code"]().transcript("\n".join(FIXTURES["claude-code"]["stdout"]) + "\nnot json\n", [])
    assert cc.source == "claude-code-stream-json" and cc.final_answer == "Done: wrote out.txt"
    assert [(m.role, m.tool_name) for m in cc.messages] == [("assistant", ""), ("tool", "Bash"), ("assistant", "")]
    assert cc.messages[0].tool_calls[0].arguments == {"command": "echo hi > out.txt"}
    assert cc.messages[1].text == "(Bash completed with no output)"

    cx = HARNESSES["codex"]().transcript("\n".join(FIXTURES["codex"]["stdout"]), [])
    assert cx.source == "codex-json" and cx.final_answer == "Done: wrote out.txt"
    assert [c.arguments for m in cx.messages for c in m.tool_calls] == [{"command": "/bin/bash -lc 'echo hi > out.txt'"}]

    # OpenClaw prints only a summary and agentloop a cut log: with no proxy log there is no transcript
    for name in ("openclaw", "agentloop"):
        t = HARNESSES[name]().transcript('{"ok": true, "final": "x"}', [])
        assert (t.source, t.messages, t.final_answer) == ("none", [], None)
