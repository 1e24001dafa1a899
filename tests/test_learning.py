"""The policy learns, through the full black-box path: agentloop subprocess → proxy → records → trees → train → reload.

A smaller variant of recipes/quickstart.toml (4 toy tasks × 8 samples, fixed seeds) run by the real
`clawgym run`. The toy tasks score how purely the agent's final answer is digits; the random tiny
policy starts near 0.05.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "tasks" / "toy"


def small_recipe(tmp: Path, algo: str, steps: int = 7, extra_train: str = "") -> Path:
    tasks = tmp / "tasks"
    for d in sorted(TOY.iterdir())[:4]:
        shutil.copytree(d, tasks / d.name)
    recipe = tmp / f"{algo}.toml"
    recipe.write_text(f"""
[run]
name = "learn-{algo}"
steps = {steps}
seed = 0

[model]
init = "tiny"

[rollout]
tasks = "tasks"
harnesses = ["agentloop"]
n = 8
concurrency = 8
timeout = 60

[rollout.agentloop]
max_turns = 1
max_tokens = 8

[train]
algo = "{algo}"
lr = 0.05
{extra_train}
""")
    return recipe


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clawgym.cli", "run", *args], cwd=cwd, capture_output=True, text=True, timeout=1500)


def rewards(run_dir: Path) -> list[float]:
    return [m.values["rollout/reward_mean"] for m in A.read_metrics(run_dir / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("algo,extra", [("grpo", ""), ("ppo", "value_lr = 0.01\nvalue_warmup_steps = 4")])
def test_policy_learns_the_toy_tasks(tmp_path: Path, algo: str, extra: str) -> None:
    recipe = small_recipe(tmp_path, algo, extra_train=extra)
    r = run(str(recipe), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / f"learn-{algo}"
    curve = rewards(run_dir)
    assert len(curve) == 7
    last3 = statistics.fmean(curve[-3:])
    assert last3 >= 0.8, curve
    assert last3 >= 3 * curve[0], curve
    # every step went through the proxy with the policy of the step before (weights synced)
    for step in range(1, 8):
        rollouts = A.read_table(run_dir / f"step-{step:04d}" / "rollouts.parquet", A.RolloutRecord)
        calls = A.read_table(run_dir / f"step-{step:04d}" / "calls.parquet", A.CallRecord)
        assert len(rollouts) == 32 and {r.status for r in rollouts} == {"ok"}
        assert {c.policy_version for c in calls} == {step - 1}
    assert (run_dir / "plots" / "reward.png").stat().st_size > 1000
    assert (run_dir / "checkpoints" / "step-0007" / "model.safetensors").exists()
