"""The policy learns, through the full black-box path: agentloop subprocess → proxy → records → trees → train → reload.

A smaller variant of recipes/quickstart.toml (4 toy tasks × 8 samples, fixed seeds) run by the real
`clawgym run`. The toy tasks score how purely the agent's final answer is digits; the random tiny
policy starts near 0.05.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A

from toy import write_toy_recipe

# Sampling on the CPU engine is not bit-reproducible (batches form as rollouts arrive): the reward
# usually passes 0.8 by step 5-6; 10 steps leave room for a slower start.
STEPS = 10


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clawgym.cli", "run", *args], cwd=cwd, capture_output=True, text=True, timeout=1500)


def rewards(run_dir: Path) -> list[float]:
    return [m.values["rollout/reward_mean"] for m in A.read_metrics(run_dir / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("algo,extra", [("grpo", ""), ("ppo", "value_lr = 0.01\nvalue_warmup_steps = 4")])
def test_policy_learns_the_toy_tasks(tmp_path: Path, algo: str, extra: str) -> None:
    recipe = write_toy_recipe(tmp_path, f"learn-{algo}", algo=algo, steps=STEPS, n=8, tasks=4, train_extra=extra)
    r = run(str(recipe), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / f"learn-{algo}"
    curve = rewards(run_dir)
    assert len(curve) == STEPS
    last3 = statistics.fmean(curve[-3:])
    assert last3 >= 0.8, curve
    assert last3 >= 3 * curve[0], curve
    # every step went through the proxy with the policy of the step before (weights synced)
    for step in range(1, STEPS + 1):
        rollouts = A.read_table(run_dir / f"step-{step:04d}" / "rollouts.parquet", A.RolloutRecord)
        calls = A.read_table(run_dir / f"step-{step:04d}" / "calls.parquet", A.CallRecord)
        assert len(rollouts) == 32 and {r.status for r in rollouts} == {"ok"}
        assert {c.policy_version for c in calls} == {step - 1}
    assert (run_dir / "plots" / "reward.png").stat().st_size > 1000
    assert (run_dir / "checkpoints" / f"step-{STEPS:04d}" / "model.safetensors").exists()
