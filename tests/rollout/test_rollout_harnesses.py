"""The real harnesses through the rollout runner: `claude-code`, `codex` and `openclaw` each solve a
small task in their own sandbox against an in-process proxy (scripted engine).

The model's answers are scripted: one shell tool call (each harness's own tool: Claude Code's
`Bash`, Codex's `exec_command`, OpenClaw's `exec`) that writes out.txt, then a final text. The
right content scores 1, a wrong one 0; the records of every rollout are settled, each call is
classified as the main agent's, each rollout's transcript holds its shell call and result, and the second prompt extends the first prompt plus its sampled
tokens (token in, token out through each protocol).

The binaries come from `clawgym harness install NAME` (pinned npm versions); without one, its test
skips with the adapter's reason. With the adapters' slim settings every harness's prompt fits the
tiny model's 32k window (Claude Code ~6k tokens, Codex ~13k, OpenClaw ~19k); the last test
shows `clawgym rollout --max-context` reaching the proxy (a window below the prompt is refused).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.rollout.harnesses import HARNESSES
from clawgym.rollout.runner import RolloutConfig, run_rollouts
from helpers import has_marker, make_task, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.harness]

CHECK = textwrap.dedent("""\
    import json, sys, pathlib
    f = pathlib.Path(sys.argv[1]) / "out.txt"
    print(json.dumps({"content": f.exists() and f.read_text().strip() == "hi"}))
""")
INSTRUCTION = "Create a file out.txt containing hi by running a shell command."

# harness -> (protocol, the tool call that runs `cmd`, rollouts to run, wall-clock timeout, whether each
# prompt extends the previous one: OpenClaw appends a fresh "internal context" user message after the
# conversation on every turn, so its second prompt branches off before that message — a tree, not a chain)
SHELL = {
    "claude-code": ("anthropic", lambda cmd: ("Bash", {"command": cmd, "description": "write out.txt"}), 2, 180, True),
    "codex": ("openai-responses", lambda cmd: ("exec_command", {"cmd": cmd}), 2, 180, True),
    # OpenClaw starts slowly and heavily (docs/harnesses.md): one rollout, a generous timeout
    "openclaw": ("openai-chat", lambda cmd: ("exec", {"command": cmd}), 1, 420, False),
}
COMMANDS = ["echo hi > out.txt", "echo bye > out.txt"]  # sample 0 solves the task, sample 1 does not


def shell_call(shell, cmd: str) -> str:
    """The model text of one call of the harness's shell tool running `cmd`."""
    name, args = shell(cmd)
    return tool_call(name, **args)


@pytest.mark.parametrize("harness", list(SHELL))
def test_real_harness_solves_a_task_through_the_runner(harness: str, tmp_path: Path, tiny_model: Path, tiny_tokenizer) -> None:
    if (why := HARNESSES[harness]().missing()) is not None:
        pytest.skip(why)
    protocol, shell, n, timeout, chain = SHELL[harness]
    make_task(tmp_path / "tasks", "hello", INSTRUCTION, timeout, check=CHECK)
    script = tmp_path / "script.jsonl"
    with open(script, "w") as f:
        for i in range(n):
            rid = f"hello.{harness}.{i}"
            # the first answer takes a moment: the harness waits on an open stream
            f.write(json.dumps({"rollout_id": rid, "text": shell_call(shell, COMMANDS[i]), "delay_s": 0.3}) + "\n")
            f.write(json.dumps({"rollout_id": rid, "text": "Done: wrote out.txt"}) + "\n")
    config = RolloutConfig(tasks=tmp_path / "tasks", harnesses=[harness], out=tmp_path / "out", group_size=n, concurrency=n,
                           model=tiny_model, engine="scripted", engine_options={"script": str(script)})
    summary = run_rollouts(config)

    rollouts = {r.rollout_id: r for r in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    assert sorted(rollouts) == [f"hello.{harness}.{i}" for i in range(n)]
    for i, want in zip(range(n), (1.0, 0.0)):
        r = rollouts[f"hello.{harness}.{i}"]
        assert (r.status, r.reward, r.n_calls) == ("ok", want, 2), r
        assert json.loads(r.subscores_json) == {"code/content": want}
        assert "outside connection" not in r.error, r.error  # the quiet settings reach nothing but the proxy
    assert summary.n_calls == 2 * n

    # what the agent did reached the verifier and transcripts.jsonl: the prompt, its shell call with
    # the scripted arguments, the real tool result, the final answer
    transcripts = A.read_transcripts(tmp_path / "out" / "transcripts.jsonl")
    for i in range(n):
        t = transcripts[f"hello.{harness}.{i}"]
        assert (t.harness, t.source, t.final_answer) == (harness, "proxy", "Done: wrote out.txt"), t
        assert any(INSTRUCTION in m.text for m in t.messages if m.role == "user")
        name, args = shell(COMMANDS[i])
        assert [(c.name, c.arguments) for m in t.messages for c in m.tool_calls] == [(name, args)]
        (result,) = [m for m in t.messages if m.role == "tool"]
        assert result.tool_name == name and result.tool_call_id

    calls = A.materialize_prompts(A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord))
    for i in range(n):
        first, second = sorted((c for c in calls if c.rollout_id == f"hello.{harness}.{i}"), key=lambda c: c.seq)
        for c in (first, second):
            assert (c.status, c.protocol, c.role) == ("ok", protocol, "main"), c
        assert shell("")[0] in first.tool_names
        # The harness sent the first answer back as its assistant turn: the proxy splices in the
        # sampled tokens, so that turn is exactly them, and everything before it is the first prompt's.
        turn = tiny_tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False) + first.output_ids
        at = find(second.prompt_ids, turn)
        assert at >= 0, tiny_tokenizer.decode(second.prompt_ids[-400:])
        assert second.prompt_ids[:at] == first.prompt_ids[:at]
        if chain:  # the second prompt is the first prompt, its sampled tokens, then the tool result
            seq = first.prompt_ids + first.output_ids
            assert second.prompt_ids[: len(seq)] == seq and len(second.prompt_ids) > len(seq)
            assert second.render_mode == "incremental"  # only the new messages were rendered


def find(seq: list[int], sub: list[int]) -> int:
    """Where `sub` starts in `seq` (its last occurrence), or -1."""
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i: i + len(sub)] == sub:
            return i
    return -1


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_real_harness_killed_mid_call_is_a_timeout_that_settles(harness: str, tmp_path: Path, tiny_model: Path) -> None:
    # The wall clock runs out while the harness waits for a (streamed) answer: the rollout is a
    # timeout scored as is, the proxy drops the generation and records the call as cancelled at once.
    if (why := HARNESSES[harness]().missing()) is not None:
        pytest.skip(why)
    _, shell, _, _, _ = SHELL[harness]
    make_task(tmp_path / "tasks", "killed", INSTRUCTION, timeout=12, check=CHECK)
    script = tmp_path / "script.jsonl"
    with open(script, "w") as f:
        f.write(json.dumps({"rollout_id": f"killed.{harness}.0", "text": shell_call(shell, "echo hi > out.txt")}) + "\n")
        f.write(json.dumps({"rollout_id": f"killed.{harness}.0", "text": "Done.", "delay_s": 300}) + "\n")
    config = RolloutConfig(tasks=tmp_path / "tasks", harnesses=[harness], out=tmp_path / "out", model=tiny_model,
                           engine="scripted", engine_options={"script": str(script)}, settle_timeout_s=20)
    (r,) = run_rollouts(config).rollouts
    assert (r.status, r.reward) == ("timeout", 1.0), r
    calls = sorted(A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord), key=lambda c: c.seq)
    assert r.n_calls == len(calls) == 2
    assert [c.status for c in calls] == ["ok", "cancelled"]
    # nothing the harness started is left (every sandbox process carries its rollout id)
    assert [p for p in os.listdir("/proc") if p.isdigit() and has_marker(p, f"killed.{harness}.0")] == []


@pytest.mark.parametrize("harness", list(SHELL))
def test_real_harness_ends_on_a_spent_call_budget_and_is_scored(harness: str, tmp_path: Path, tiny_model: Path) -> None:
    # A policy that writes its answer and then keeps calling tools: with `max_calls` the proxy refuses
    # the call past the budget, the harness ends on that 400 well before its wall clock, and the
    # rollout is scored on the workspace it left (status timeout, the bound named in its error).
    if (why := HARNESSES[harness]().missing()) is not None:
        pytest.skip(why)
    _, shell, _, timeout, _ = SHELL[harness]
    make_task(tmp_path / "tasks", "loops", INSTRUCTION, timeout, check=CHECK)
    script = tmp_path / "script.jsonl"
    answers = [shell_call(shell, "echo hi > out.txt")] + [shell_call(shell, "ls")] * 8 + ["Done."]
    script.write_text("".join(json.dumps({"rollout_id": f"loops.{harness}.0", "text": t}) + "\n" for t in answers))
    config = RolloutConfig(tasks=tmp_path / "tasks", harnesses=[harness], out=tmp_path / "out", model=tiny_model,
                           engine="scripted", engine_options={"script": str(script)}, max_calls=2)
    (r,) = run_rollouts(config).rollouts
    assert (r.status, r.reward, r.n_calls) == ("timeout", 1.0, 2), r
    assert r.error.startswith("call budget spent: 2 model calls ([rollout] max_calls)") and "killed after" not in r.error, r.error
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    assert [c.status for c in sorted(calls, key=lambda c: c.seq)] == ["ok", "ok"]  # the refused request sampled nothing


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
def test_a_failing_engine_is_an_infra_error_not_the_policys(harness: str, tmp_path: Path, tiny_model: Path) -> None:
    # Every model call fails in the engine. Codex gives up at once ("Selected model is at capacity");
    # Claude Code retries with backoff for minutes and is cut off by the wall clock. Either way the
    # rollout is excluded (infra_error, no reward), and every failed attempt is recorded.
    if (why := HARNESSES[harness]().missing()) is not None:
        pytest.skip(why)
    make_task(tmp_path / "tasks", "down", INSTRUCTION, timeout=15, check=CHECK)
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps({"rollout_id": f"down.{harness}.0", "error": "engine down"}) + "\n" for _ in range(40)))
    config = RolloutConfig(tasks=tmp_path / "tasks", harnesses=[harness], out=tmp_path / "out", model=tiny_model,
                           engine="scripted", engine_options={"script": str(script)})
    (r,) = run_rollouts(config).rollouts
    assert (r.status, r.reward) == ("infra_error", None), r
    assert "engine down" in r.error or "at capacity" in r.error, r.error  # the engine's message, or Codex's for it
    calls = A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)
    assert calls and {c.status for c in calls} <= {"engine_error", "cancelled"} and calls[0].status == "engine_error"


def test_cli_rollout_drives_claude_code_and_max_context_reaches_the_proxy(tmp_path: Path, tiny_model: Path) -> None:
    # `clawgym rollout` with a real harness; `--max-context` sets the in-process proxy's window (here
    # below the prompt's length, so the call is refused as too long, with the error a real API gives).
    if (why := HARNESSES["claude-code"]().missing()) is not None:
        pytest.skip(why)
    make_task(tmp_path / "tasks", "hello", INSTRUCTION, 120, check=CHECK)
    script = tmp_path / "script.jsonl"
    _, shell, _, _, _ = SHELL["claude-code"]
    script.write_text("".join(json.dumps({"rollout_id": "hello.claude-code.0", "text": t}) + "\n"
                              for t in (shell_call(shell, "echo hi > out.txt"), "Done.")))
    args = ["--tasks", str(tmp_path / "tasks"), "--harness", "claude-code", "--model", str(tiny_model), "--engine", "scripted",
            "--script", str(script)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    ok = subprocess.run([sys.executable, "-m", "clawgym.cli", "rollout", *args, "--out", str(tmp_path / "a")],
                        capture_output=True, text=True, env=env, timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "1 rollouts (ok: 1), 2 calls, mean reward 1.000" in ok.stdout, ok.stdout
    small = subprocess.run([sys.executable, "-m", "clawgym.cli", "rollout", *args, "--max-context", "1000", "--out", str(tmp_path / "b")],
                           capture_output=True, text=True, env=env, timeout=300)
    assert small.returncode == 0, small.stderr[-2000:]
    (r,) = A.read_table(tmp_path / "b" / "rollouts.parquet", A.RolloutRecord)
    # Claude Code gives up (a single exchange cannot be compacted) and says why; refused calls are not recorded
    assert (r.status, r.reward, r.n_calls) == ("harness_error", 0.0, 0), r
    assert "prompt is too long" in r.error.lower(), r.error
