"""The policy learns, through the full black-box path: agentloop subprocess → proxy → records → trees → train → reload.

The quickstart's settings (8 toy tasks × 8 samples, lr 0.03, fixed seeds) run by the real
`clawgym run` for 10 steps, once with GRPO and once with PPO (a value model: its fresh head starts
at the batch's mean return, value lr 1e-3, 4 warm-up steps, whitened advantages). The toy tasks
score how purely the agent's final answer is digits; the random tiny policy starts near 0.05.
Smaller batches (32 rollouts) at a higher rate learned in most runs but sometimes collapsed first,
so the test keeps the quickstart's batch.
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


ALGOS = {"grpo": "", "ppo": "value_lr = 0.001\nvalue_warmup_steps = 4\n"}


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(1800)  # ~5.5 min alone on 2 idle cores; a loaded machine needs several times that
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_policy_learns_the_toy_tasks(algo: str, tmp_path: Path) -> None:
    recipe = write_toy_recipe(tmp_path, f"learn-{algo}", algo=algo, steps=STEPS, n=8, tasks=8, lr=0.03,
                              train_extra=ALGOS[algo])
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
        assert len(rollouts) == 64 and {r.status for r in rollouts} == {"ok"}
        assert {c.policy_version for c in calls} == {step - 1}
    assert (run_dir / "plots" / "reward.png").stat().st_size > 1000
    assert (run_dir / "checkpoints" / f"step-{STEPS:04d}" / "model.safetensors").exists()
    if algo == "ppo":  # the value model went along, step to step
        assert (run_dir / "checkpoints" / f"step-{STEPS:04d}" / "value" / "value_head.safetensors").exists()
