"""`clawgym run --resume` after SIGKILL in each stage; mix-harness groups; offline retraining from saved trees."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawgym import artifacts as A

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "tasks" / "toy"


def write_recipe(tmp: Path, name: str, *, steps: int, harnesses: str = '["agentloop"]', n: int = 4, extra: str = "") -> Path:
    tasks = tmp / "tasks"
    if not tasks.exists():
        import shutil

        for d in sorted(TOY.iterdir())[:2]:
            shutil.copytree(d, tasks / d.name)
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[run]
name = "{name}"
steps = {steps}
seed = 0

[model]
init = "tiny"

[rollout]
tasks = "tasks"
harnesses = {harnesses}
n = {n}
concurrency = 4
timeout = 60

[rollout.agentloop]
max_turns = 1
max_tokens = 4

[train]
algo = "grpo"
lr = 0.05
{extra}
""")
    return path


def clawgym_run(recipe: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "clawgym.cli", "run", str(recipe), *extra], cwd=recipe.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def kill_when(proc: subprocess.Popen, ready, timeout: float = 300) -> bool:
    """SIGKILL the run's whole process group as soon as `ready()` holds; False if it finished first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if ready():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError("the kill point was never reached")


def lines(path: Path) -> int:
    return len(A.read_jsonl(path).records) if path.exists() else 0


@pytest.mark.slow
def test_killed_in_each_stage_the_resumed_run_has_exactly_the_planned_rollouts(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "resume", steps=2)
    run_dir = tmp_path / "runs" / "resume"
    s1 = run_dir / "step-0001"
    ckpt1 = run_dir / "checkpoints" / "step-0001"
    kill_points = [
        ("collect", lambda: lines(s1 / "results.jsonl") >= 3),
        ("reconstruct", lambda: (s1 / "rollouts.parquet").exists()),
        ("optimize", lambda: (s1 / "trees.parquet").exists()),
        ("sync/report", lambda: (ckpt1 / "trainer_state.json").exists()),
    ]
    killed = []
    for i, (stage, ready) in enumerate(kill_points):
        proc = clawgym_run(recipe, *(["--resume"] if i else []))
        if kill_when(proc, ready):
            killed.append(stage)
    assert "collect" in killed  # the others may finish before the poll sees them: any moment is fine
    final = clawgym_run(recipe, "--resume")
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err.decode()[-2000:]

    for step in (1, 2):
        sdir = run_dir / f"step-{step:04d}"
        planned = {f"s{step:04d}.numbers-{t}.agentloop.{i}" for t in (0, 1) for i in range(4)}
        results = [r["rollout_id"] for r in A.read_jsonl(sdir / "results.jsonl").records]
        assert sorted(results) == sorted(planned)  # none lost, none duplicated
        assert {r.rollout_id for r in A.read_table(sdir / "rollouts.parquet", A.RolloutRecord)} == planned
        assert {p.stem for p in (sdir / "records").glob("*.jsonl")} == planned
        calls = A.read_table(sdir / "calls.parquet", A.CallRecord)
        assert {c.rollout_id for c in calls} == planned and len(calls) == len(planned)
    assert [m.step for m in A.read_metrics(run_dir / "metrics.jsonl")] == [1, 2]


def test_a_finished_run_refuses_to_restart_and_a_changed_recipe_to_resume(tmp_path: Path) -> None:
    from clawgym.errors import UserError
    from clawgym.loop import _prepare
    from clawgym.config import load_recipe

    recipe = write_recipe(tmp_path, "guard", steps=1)
    _prepare(load_recipe(recipe), resume=False)
    with pytest.raises(UserError, match="already holds a run; pass --resume"):
        _prepare(load_recipe(recipe), resume=False)
    recipe.write_text(recipe.read_text().replace("lr = 0.05", "lr = 0.01"))
    with pytest.raises(UserError, match="differs from"):
        _prepare(load_recipe(recipe), resume=True)


@pytest.mark.slow
def test_mix_harness_keeps_groups_per_harness_and_reports_each(tmp_path: Path) -> None:
    from clawgym.rollout.harnesses import HARNESSES

    if HARNESSES["claude-code"]().missing():
        pytest.skip(HARNESSES["claude-code"]().missing())
    recipe = write_recipe(tmp_path, "mix", steps=1, harnesses='["agentloop", "claude-code"]', n=2,
                          extra="")
    text = recipe.read_text().replace("[rollout.agentloop]", "[rollout.claude-code]\nmax_turns = 2\n\n[rollout.agentloop]")
    recipe.write_text(text)
    proc = clawgym_run(recipe)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err.decode()[-2000:]
    run_dir = tmp_path / "runs" / "mix"
    rollouts = A.read_table(run_dir / "step-0001" / "rollouts.parquet", A.RolloutRecord)
    assert {r.harness for r in rollouts} == {"agentloop", "claude-code"}
    assert {r.group_id for r in rollouts} == {f"numbers-{t}/{h}" for t in (0, 1) for h in ("agentloop", "claude-code")}
    calls = A.read_table(run_dir / "step-0001" / "calls.parquet", A.CallRecord)
    assert {c.protocol for c in calls} >= {"openai-chat", "anthropic"}
    values = A.read_metrics(run_dir / "metrics.jsonl")[0].values
    assert "rollout/reward_mean/agentloop" in values and "rollout/reward_mean/claude-code" in values


@pytest.mark.slow
def test_offline_retraining_from_saved_trees_gives_the_same_loss_curve(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "online", steps=2)
    proc = clawgym_run(recipe)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    offline = tmp_path / "offline.toml"
    offline.write_text(f"""
[run]
name = "offline"
steps = 2
seed = 0

[model]
init = "tiny"

[offline]
from_run = "runs/online"

[train]
algo = "grpo"
lr = 0.05
""")
    proc = clawgym_run(offline)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]

    def losses(run: str) -> list[float]:
        out = []
        for step in (1, 2):
            out += [r["train/loss"] for r in A.read_jsonl(tmp_path / "runs" / run / f"step-{step:04d}" / "train.jsonl").records
                    if "train/loss" in r]
        return out

    online, again = losses("online"), losses("offline")
    assert len(online) == len(again) >= 2
    assert all(abs(a - b) <= 1e-6 for a, b in zip(online, again)), (online, again)
