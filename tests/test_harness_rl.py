"""One RL step through a real harness on a real model: `clawgym run` on SmolLM2-135M-Instruct, every
stage through the unmodified Claude Code binary.

The recipe is recipes/claude-code.toml in miniature (3 `lookup` train tasks, 1 held-out): teacher
demonstrations recorded through Claude Code (the `teacher` engine answering Claude Code's own
Bash/Write tools in SmolLM2's call form), a short SFT on them, one GRPO step on SmolLM2's own
Claude Code rollouts, the proxy's engine reloading the new weights, and the held-out evaluation
served by that reloaded policy. What must hold is the plumbing, not what the policy learned:

- every record is prefix-exact: within a rollout each call's prompt extends the previous call's
  prompt plus its sampled tokens, token for token (what the trees and the trainer rely on);
- the policy version advanced: the step's rollouts were sampled by version 0 (the SFT policy),
  the evaluation after the reload by version 1;
- the reload is real: the logprobs the engine recorded for the evaluation's tokens are the step-1
  checkpoint's own, recomputed here by a plain forward of that checkpoint (and, when the step's
  groups were not all flat so that it moved the weights, not the SFT checkpoint's).

The SFT is 4 updates on the 3 demonstrations, so the step's own rollouts already try Claude
Code's tools. It is `heavy`: on a shared 2-core machine it runs longer than a default-run test may
(its wall time: docs/results.md, `python3 -m pytest -m heavy tests/test_harness_rl.py`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.tasks.families import make_tasks
from helpers import skip_unless_installed

pytestmark = [pytest.mark.slow, pytest.mark.harness, pytest.mark.heavy]

RECIPE = """
[run]
name = "ci"
steps = 1
seed = 0

[model]
path = "{model}"

[engine]
name = "hf"
chat_template = "smollm2-tools"

[rollout]
tasks = "train"
harnesses = ["claude-code"]
group_size = 2
concurrency = 4
timeout_s = 900

[rollout.claude-code]
max_turns = 3
max_tokens = 64
tools = "Bash,Read,Write,Edit"

[sft]
demonstrations = 1
family = "lookup"
epochs = 4
minibatches = 1
lr = 0.0005

[train]
algo = "grpo"
lr = 0.00002

[eval]
every = 1
tasks = "heldout"
samples_per_task = 1
"""


def prefix_exact(calls: list[A.CallRecord]) -> int:
    """Assert each rollout's calls extend one another token for token; the number of rollouts."""
    by_rollout: dict[str, list[A.CallRecord]] = {}
    for c in calls:
        by_rollout.setdefault(c.rollout_id, []).append(c)
    for rid, mine in by_rollout.items():
        mine.sort(key=lambda c: c.seq)
        assert [c.seq for c in mine] == list(range(len(mine))), rid
        for prev, cur in zip(mine, mine[1:]):
            seq = prev.prompt_ids + prev.output_ids
            assert cur.prompt_ids[: len(seq)] == seq, f"{rid}: call {cur.seq} does not extend call {prev.seq}"
    return len(by_rollout)


@pytest.mark.timeout(3000)
def test_one_grpo_step_through_claude_code_on_smollm2(smollm2_model: Path, tmp_path: Path) -> None:
    skip_unless_installed("claude-code")
    make_tasks("lookup", tmp_path / "train", n=3, seed=0, split="train")
    make_tasks("lookup", tmp_path / "heldout", n=1, seed=0, split="heldout")
    (tmp_path / "r.toml").write_text(RECIPE.format(model=smollm2_model))
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "run", str(tmp_path / "r.toml")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=2900)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "runs" / "ci"

    def calls(folder: Path) -> list[A.CallRecord]:
        return A.materialize_prompts(A.read_table(folder / "calls.parquet", A.CallRecord))

    # the teacher's demonstrations went through Claude Code and solved every task
    teacher = A.read_table(run / "sft" / "rollouts.parquet", A.RolloutRecord)
    assert sorted(t.reward for t in teacher) == [1.0] * 3 and {t.harness for t in teacher} == {"claude-code"}
    sft_calls = calls(run / "sft")
    assert prefix_exact(sft_calls) == 3 and {c.protocol for c in sft_calls} == {"anthropic"}
    assert all({"Bash", "Write"} <= set(c.tool_names) for c in sft_calls)  # Claude Code's own tools were offered

    # the GRPO step: SmolLM2's own rollouts through Claude Code, sampled by the SFT policy (version 0)
    step = calls(run / "step-0001")
    rollouts = A.read_table(run / "step-0001" / "rollouts.parquet", A.RolloutRecord)
    assert len(rollouts) == 6 and all(x.status in ("ok", "harness_error") and x.reward is not None for x in rollouts), \
        [(x.status, x.error) for x in rollouts]
    assert prefix_exact(step) == 6 and {c.policy_version for c in step} == {0}
    assert all(c.status == "ok" and 1 <= len(c.output_ids) <= 64 for c in step)
    assert (run / "checkpoints" / "step-0001").is_dir()

    # after the reload the same proxy served the held-out evaluation as version 1
    served = calls(run / "eval" / "step-0001")
    assert prefix_exact(served) == 1 and {c.policy_version for c in served} == {1}
    lines = A.read_metrics(run / "metrics.jsonl")
    assert [m.step for m in lines] == [0, 1] and "eval/pass@1" in lines[1].values

    # the reloaded engine is the step-1 checkpoint: its recorded logprobs are that checkpoint's own
    import torch
    from transformers import AutoModelForCausalLM

    from clawgym.run.mismatch import measure

    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-0001", dtype=torch.float32).eval()
    m = measure(run / "eval" / "step-0001" / "calls.parquet", model)
    assert (m.policy_version, m.calls, m.hot_calls) == (1, len(served), 0) and m.tokens > 0
    assert m.max_abs < 1e-3, m
    if lines[1].values.get("train/rollouts"):  # the step moved the weights (a batch of flat groups trains nothing):
        sft = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "sft", dtype=torch.float32).eval()
        assert measure(run / "eval" / "step-0001" / "calls.parquet", sft).max_abs > 10 * max(m.max_abs, 1e-5)  # not the SFT policy's
    table = (run / "table.md").read_text()
    assert "| base |" in table and "| SFT |" in table and "| SFT+RL (step-0001) |" in table
