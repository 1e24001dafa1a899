"""The real harnesses with the real model: Claude Code and Codex run a toy task against the hf engine
serving SmolLM2-135M-Instruct (its own template, the json-list tool parser), and a prompt longer
than the model's window ends each of them as a scored harness_error naming the overflow. OpenClaw
and Codex with their `slim` option send a first prompt that fits SmolLM2's window (Codex's a
fraction of its installed one), with scripted answers written in SmolLM2's tool-call form (the
scripted engine, SmolLM2's tokenizer and template).

The answers may be poor; what must hold is the plumbing. Each rollout ends without `infra_error`,
every call the harness made is recorded with the engine's own ids and logprobs, and a later call
extends the earlier prompt plus its sampled tokens, token for token. A CPU engine writes SmolLM2's
tokens slowly and the proxy sends a turn only once it is generated, so each call is capped with the
adapters' `max_tokens` option (docs/harnesses.md, "Real models on a CPU").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.rollout.runner import RolloutConfig, run_rollouts
from helpers import make_task, skip_unless_installed

ROOT = Path(__file__).resolve().parents[2]
HARNESS_NAMES = ["claude-code", "codex"]
PROTOCOL = {"claude-code": "anthropic", "codex": "openai-responses"}
# tokens per call: at a few tokens/s on a loaded 2-core machine this keeps every call far below
# Claude Code's 300 s stream idle limit and the rollout within its wall clock
MAX_TOKENS = 48
# Claude Code's request_timeout (default 1800 s) already covers a slow prefill; Codex's stream idle
# limit is raised to match (a ~5.8k-token prompt takes minutes on a loaded machine)
OPTIONS = {"claude-code": {"max_tokens": MAX_TOKENS}, "codex": {"max_tokens": MAX_TOKENS, "idle_timeout_s": 1800}}
# how each harness ends when the model's answers keep running into max_tokens (a 135M model rambles):
# Claude Code continues a few times, then gives up; Codex fails the turn on an incomplete response
POLICY_ENDING = {"claude-code": "output token maximum", "codex": "Incomplete response returned, reason: max_output_tokens"}
# how each harness reports the refusal it understood (its last words, kept after the runner's reason)
OWN_ACCOUNT = {"claude-code": "Prompt is too long", "codex": "ran out of room in the model's context window"}

pytestmark = [pytest.mark.slow, pytest.mark.harness]



def toy_tasks(root: Path) -> Path:
    shutil.copytree(ROOT / "recipes" / "tasks" / "toy" / "numbers-0", root / "numbers-0")
    return root


def rollouts(tmp_path: Path, model: Path, timeout: float, **engine_options) -> tuple[dict[str, A.RolloutRecord], list[A.CallRecord]]:
    config = RolloutConfig(tasks=toy_tasks(tmp_path / "tasks"), harnesses=HARNESS_NAMES, out=tmp_path / "out", concurrency=2,
                           model=model, engine="hf", engine_options=engine_options, timeout_s=timeout, settle_timeout_s=120,
                           harness_options=OPTIONS)
    run_rollouts(config)
    recs = {r.rollout_id: r for r in A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)}
    return recs, A.materialize_prompts(A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord))


@pytest.mark.heavy
@pytest.mark.timeout(2400)
def test_claude_code_and_codex_run_on_smollm2(smollm2_model: Path, tmp_path: Path) -> None:
    skip_unless_installed(*HARNESS_NAMES)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    recs, calls = rollouts(tmp_path, smollm2_model, timeout=1500)
    assert sorted(recs) == [f"numbers-0.{h}.0" for h in HARNESS_NAMES]
    for harness in HARNESS_NAMES:
        r = recs[f"numbers-0.{harness}.0"]
        # ok, or the policy's own failure (a poor answer, the window filled): scored either way
        assert r.status in ("ok", "harness_error"), r
        assert r.reward is not None and r.n_calls >= 1, r
        if r.status == "harness_error":  # the policy's own ending, in the harness's words
            assert r.error.startswith("context_length_exceeded: ") or POLICY_ENDING[harness] in r.error, r.error
        mine = sorted((c for c in calls if c.rollout_id == r.rollout_id), key=lambda c: c.seq)
        assert [c.seq for c in mine] == list(range(r.n_calls))
        assert all(c.status == "ok" and c.protocol == PROTOCOL[harness] for c in mine), [(c.status, c.error) for c in mine]
        for c in mine:
            assert 1 <= len(c.output_ids) <= MAX_TOKENS and len(c.output_logprobs) == len(c.output_ids)
            assert all(lp <= 0.0 for lp in c.output_logprobs)
            assert len(c.prompt_ids) + len(c.output_ids) <= 8192
        first = tok.decode(mine[0].prompt_ids)
        assert first.startswith("<|im_start|>system\n") and "Reply with a number." in first
        assert mine[0].tool_names  # the harness's tools reached the prompt
        for prev, cur in zip(mine, mine[1:]):  # token in, token out: each prompt extends the last
            seq = prev.prompt_ids + prev.output_ids
            assert cur.prompt_ids[: len(seq)] == seq, f"{harness}: call {cur.seq} does not extend call {prev.seq}"


def test_a_prompt_beyond_the_window_is_a_scored_harness_error(smollm2_model: Path, tmp_path: Path) -> None:
    # The window set below the harnesses' first prompts (~3k and ~5.8k SmolLM2 tokens): the first
    # request gets the protocol's "prompt too long" 400, each harness gives up on it, and the runner
    # records why. Nothing is generated, so this is quick even on the real model.
    skip_unless_installed(*HARNESS_NAMES)
    recs, calls = rollouts(tmp_path, smollm2_model, timeout=600, max_context=2048)
    for harness in HARNESS_NAMES:
        r = recs[f"numbers-0.{harness}.0"]
        assert (r.status, r.reward, r.n_calls) == ("harness_error", 0.0, 0), r
        assert r.error.startswith("context_length_exceeded: "), r.error
        assert OWN_ACCOUNT[harness] in r.error, r.error  # the harness understood the error and said so
    assert calls == []  # a refused request samples nothing, so nothing is recorded


# OpenClaw's slim first prompt is about 3k SmolLM2 tokens (docs/harnesses.md, "openclaw"); as installed
# it is over the 8,192-token window. The bound leaves room for a longer instruction.
SLIM_BOUND = 5000
SECRET = "key: marmalade"


def smollm2_call(name: str, **args) -> str:
    """One tool call in SmolLM2's own form (the smollm2-tools template, the json-list parser)."""
    return f"<tool_call>[{json.dumps({'name': name, 'arguments': args})}]</tool_call>"


def grep_task_rollout(harness: str, answers: list[str], model: Path, tmp_path: Path) -> list[A.CallRecord]:
    """One rollout of a task whose answer is a key found with grep, the model's turns scripted; its
    calls, in order, after asserting that the rollout scored 1 in as many calls as `answers`."""
    check = ("import json, sys, pathlib\nf = pathlib.Path(sys.argv[1]) / 'answer.txt'\n"
             "print(json.dumps({'answer': f.exists() and f.read_text().strip() == 'marmalade'}))\n")
    task = make_task(tmp_path / "tasks", "grep", "Find the key in data.txt and write it to answer.txt.", 420, check=check)
    (task / "workspace" / "data.txt").write_text(f"noise\n{SECRET}\nmore noise\n")
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps({"rollout_id": f"grep.{harness}.0", "text": t}) + "\n" for t in answers))
    config = RolloutConfig(tasks=tmp_path / "tasks", harnesses=[harness], out=tmp_path / "out", model=model,
                           engine="scripted", engine_options={"script": str(script)}, harness_options={harness: {"slim": True}})
    run_rollouts(config)
    (r,) = A.read_table(tmp_path / "out" / "rollouts.parquet", A.RolloutRecord)
    assert (r.status, r.reward, r.n_calls) == ("ok", 1.0, len(answers)), r  # grep ran, its answer was written
    calls = sorted(A.materialize_prompts(A.read_table(tmp_path / "out" / "calls.parquet", A.CallRecord)), key=lambda c: c.seq)
    assert all((c.status, c.role) == ("ok", "main") for c in calls), [(c.status, c.role, c.error) for c in calls]
    return calls


def test_openclaw_slim_fits_smollm2_and_keeps_its_shell_and_write_tools(smollm2_model: Path, tmp_path: Path) -> None:
    skip_unless_installed("openclaw")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    answers = [smollm2_call("exec", command="grep key: data.txt"),
               smollm2_call("write", path="answer.txt", content="marmalade"), "Done: wrote answer.txt"]
    calls = grep_task_rollout("openclaw", answers, smollm2_model, tmp_path)
    first = calls[0]
    assert len(first.prompt_ids) < SLIM_BOUND, len(first.prompt_ids)
    assert {"exec", "write"} <= set(first.tool_names) and "tool_search" not in first.tool_names, first.tool_names
    text = tok.decode(first.prompt_ids)
    assert "<available_skills>" not in text and "Find the key in data.txt" in text
    assert SECRET in tok.decode(calls[1].prompt_ids)  # the grep's output came back as the tool result
    # without the process and subagent tools OpenClaw appends no per-turn internal-context message, so
    # each prompt is the last one plus its sampled tokens and the tool result: a chain, not a tree
    for prev, cur in zip(calls, calls[1:]):
        seq = prev.prompt_ids + prev.output_ids
        assert cur.prompt_ids[: len(seq)] == seq and cur.render_mode == "incremental", cur.seq


# Codex's slim first prompt: a one-line instructions file, two tools and the task; as installed its
# instructions alone are ~17k characters (about 4k SmolLM2 tokens)
CODEX_SLIM_BOUND = 1500


def test_codex_slim_sends_a_short_prompt_and_keeps_its_shell_tool(smollm2_model: Path, tmp_path: Path) -> None:
    skip_unless_installed("codex")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    answers = [smollm2_call("exec_command", cmd="grep key: data.txt"),
               smollm2_call("exec_command", cmd="printf '%s' marmalade > answer.txt"), "Done: wrote answer.txt"]
    calls = grep_task_rollout("codex", answers, smollm2_model, tmp_path)
    first = calls[0]
    assert len(first.prompt_ids) < CODEX_SLIM_BOUND, len(first.prompt_ids)
    assert sorted(first.tool_names) == ["exec_command", "write_stdin"], first.tool_names
    text = tok.decode(first.prompt_ids)
    assert "Find the key in data.txt" in text and "CWD: /" in text
    for absent in ("You are a coding agent running in the Codex CLI", "<skills_instructions>", "<permissions instructions>",
                   "<environment_context>"):
        assert absent not in text, absent
    assert SECRET in tok.decode(calls[1].prompt_ids)  # the grep's output came back as the tool result
