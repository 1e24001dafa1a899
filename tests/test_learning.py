"""The quickstart learns tool use on tasks it never trained on, through the full black-box path.

`recipes/quickstart.toml` as shipped, run by the real `clawgym run`: the small random model, the
`scan` family (read files with a tool until one shows an error line, then write its name;
docs/tasks.md), held-out Pass@1 before the cold start, after it and during RL. The cold start is six
teacher trajectories through the proxy and the agentloop harness, built into trees and trained on
with a short SFT that teaches the calls' form; then GRPO steps on tasks drawn from the train split,
the policy reloaded into the proxy after each, do most of the learning.

PPO runs on the same family as a second test. It starts from the GRPO run's cold start: the loop
skips every cold-start stage whose output is complete (docs/recipes.md), so the copied stages are
not run again, and the two tests compare RL algorithms from one SFT policy.

The gates are on held-out Pass@1 after the recipe's fixed number of steps, never on time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.run.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "quickstart.toml"
COLD_START = ("model-init", "sft", "checkpoints/sft", "eval/base", "eval/sft")
STEPS = load_recipe(RECIPE).run.steps
GAIN = 0.05
"""held-out Pass@1 RL must add to SFT's in STEPS. The recipe's target is 0.10, which the measured GRPO
and PPO runs from this cold start exceed (docs/results.md, `clawgym run recipes/quickstart.toml`). The gate sits
lower because the two evals it compares are 96 samples each, whose difference has a standard
deviation of about 0.06."""


def run(recipe: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clawgym.cli", "run", str(recipe)], cwd=recipe.parent,
                          capture_output=True, text=True, timeout=3000)


def recipe_in(tmp: Path, name: str, *, replace: dict[str, str] | None = None) -> Path:
    """The shipped quickstart under another name in `tmp`, its task folders reached through a link."""
    (tmp / "tasks").symlink_to(ROOT / "recipes" / "tasks")
    text = RECIPE.read_text().replace('name = "quickstart"', f'name = "{name}"')
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


def pass_at_1(run_dir: Path) -> dict[str, float]:
    """Held-out Pass@1 by policy: base, sft and each evaluated RL step (step-NNNN)."""
    return {d.name: json.loads((d / "eval.json").read_text())["pass@1"]
            for d in sorted((run_dir / "eval").iterdir()) if (d / "eval.json").exists()}


def check_the_run(run_dir: Path, steps: int) -> dict[str, float]:
    scores = pass_at_1(run_dir)
    assert {"base", "sft", f"step-{steps:04d}"} <= set(scores), scores
    # every RL step went through the proxy with the policy of the step before (weights synced), on train tasks only
    for step in range(1, steps + 1):
        sdir = run_dir / f"step-{step:04d}"
        rollouts = A.read_table(sdir / "rollouts.parquet", A.RolloutRecord)
        calls = A.read_table(sdir / "calls.parquet", A.CallRecord)
        assert rollouts and all("-train-" in r.task_id for r in rollouts)
        assert {c.policy_version for c in calls} == {step - 1}  # the SFT policy serves as version 0
    assert (run_dir / "table.md").exists() and (run_dir / "plots" / "reward.png").stat().st_size > 1000
    return scores


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("quickstart")
    r = run(recipe_in(tmp, "quickstart"))
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "runs" / "quickstart"


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(3000)  # ~9 min alone on 2 idle cores; a loaded machine needs several times that
def test_the_quickstart_learns_tool_use_on_held_out_tasks(grpo_run: Path) -> None:
    scores = check_the_run(grpo_run, STEPS)
    # the random policy never answers; the short cold start teaches the calls' form, RL the rest
    assert scores["base"] <= 0.05 and scores["sft"] > scores["base"], scores
    assert scores[f"step-{STEPS:04d}"] >= scores["sft"] + GAIN, scores
    teacher = A.read_table(grpo_run / "sft" / "rollouts.parquet", A.RolloutRecord)
    assert len(teacher) == 6 and all(r.reward == 1.0 and "-train-" in r.task_id for r in teacher)


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(3000)
def test_ppo_on_the_same_family_from_the_same_cold_start(grpo_run: Path, tmp_path: Path) -> None:
    recipe = recipe_in(tmp_path, "quickstart-ppo", replace={'algo = "grpo"': 'algo = "ppo"\nvalue_lr = 0.001\nvalue_warmup_steps = 4'})
    run_dir = tmp_path / "runs" / "quickstart-ppo"
    for part in COLD_START:
        shutil.copytree(grpo_run / part, run_dir / part)
    r = run(recipe)
    assert r.returncode == 0, r.stderr[-3000:]
    scores = check_the_run(run_dir, STEPS)
    assert scores["sft"] == pass_at_1(grpo_run)["sft"]  # the copied cold start was not run again
    assert scores[f"step-{STEPS:04d}"] >= scores["sft"] + GAIN, scores
    assert (run_dir / "checkpoints" / f"step-{STEPS:04d}" / "value" / "value_head.safetensors").exists()
