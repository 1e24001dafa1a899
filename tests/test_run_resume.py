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

from toy import write_toy_recipe


def write_recipe(tmp: Path, name: str, *, steps: int, harnesses: str = '["agentloop"]', n: int = 4, algo: str = "grpo") -> Path:
    return write_toy_recipe(tmp, name, algo=algo, steps=steps, n=n, tasks=2, harnesses=harnesses, max_tokens=4, concurrency=4)


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
    from clawgym.run.loop import _prepare
    from clawgym.run.recipe import load_recipe

    recipe = write_recipe(tmp_path, "guard", steps=1)
    _prepare(load_recipe(recipe), resume=False)
    with pytest.raises(UserError, match="already holds a run; pass --resume"):
        _prepare(load_recipe(recipe), resume=False)
    recipe.write_text(recipe.read_text().replace("lr = 0.05", "lr = 0.01"))
    with pytest.raises(UserError, match="differs from"):
        _prepare(load_recipe(recipe), resume=True)
    # a run saved by the release before, with a key's old name and without a newer key, resumes
    saved = tmp_path / "runs" / "guard" / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("lr = 0.01", "lr = 0.05"))
    saved.write_text(saved.read_text().replace("group_size = ", "n = ").replace("max_staleness = 0\n", ""))
    assert "n = 4" in saved.read_text() and "max_staleness" not in saved.read_text()
    _prepare(load_recipe(recipe), resume=True)
    assert "group_size = 4" in saved.read_text()  # saved again as this release spells it


def test_a_step_trained_before_a_resume_is_reported_from_its_train_jsonl_without_training(tmp_path: Path, monkeypatch) -> None:
    import clawgym.run.steps
    from clawgym.run.loop import run

    recipe = write_recipe(tmp_path, "report", steps=1)
    first = clawgym_run(recipe)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err.decode()[-2000:]
    metrics = tmp_path / "runs" / "report" / "metrics.jsonl"
    [line] = A.read_metrics(metrics)
    metrics.unlink()  # killed after the step's checkpoint, before its metrics line

    def refuse(*args, **kwargs):
        raise AssertionError("train() was called for a step whose checkpoint is complete")

    monkeypatch.setattr(clawgym.run.steps, "train", refuse)
    [again] = run(recipe, resume=True)
    measured = ("time/", "memory/", "proxy/")  # phase times, peaks and the engine's cache counters belong to the process that ran the step
    assert again.step == 1 and any(k.startswith("train/") for k in again.values)
    assert {k: v for k, v in again.values.items() if not k.startswith(measured)} == \
        {k: v for k, v in line.values.items() if not k.startswith(measured)}


@pytest.mark.slow
def test_mix_harness_keeps_groups_per_harness_and_reports_each(tmp_path: Path) -> None:
    from clawgym.rollout.harnesses import HARNESSES

    if HARNESSES["claude-code"]().missing():
        pytest.skip(HARNESSES["claude-code"]().missing())
    recipe = write_recipe(tmp_path, "mix", steps=1, harnesses='["agentloop", "claude-code"]', n=2)
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
    # PPO: every rollout carries a signal, so both steps train whatever the toy rewards (GRPO groups
    # of 4 equal rewards, common for the random policy, leave a step with nothing to learn).
    recipe = write_recipe(tmp_path, "online", steps=2, algo="ppo")
    proc = clawgym_run(recipe)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    offline = tmp_path / "offline.toml"
    offline.write_text("""
[run]
name = "offline"
steps = 2
seed = 0

[model]
init = "tiny"

[offline]
from_run = "runs/online"

[train]
algo = "ppo"
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


@pytest.mark.slow
def test_eval_inside_the_loop_and_standalone(tmp_path: Path) -> None:
    import json

    recipe = write_recipe(tmp_path, "evals", steps=1, n=2, algo="ppo")  # PPO: the step trains whatever the rewards
    recipe.write_text(recipe.read_text() + "\n[eval]\nevery = 1\nsamples_per_task = 2\n")
    proc = clawgym_run(recipe, "--verbose")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err.decode()[-2000:]
    for table in ("trees per rollout", "train ppo:", "update 1 |", "Pass@1 (%) by category", "step 1/1  reward"):
        assert table in err.decode()  # --verbose: every stage's tables, and the step line
    run_dir = tmp_path / "runs" / "evals"
    values = A.read_metrics(run_dir / "metrics.jsonl")[0].values
    assert 0.0 <= values["eval/pass@1"] <= 1.0 and "eval/pass@1/numbers" in values
    ev = run_dir / "eval" / "step-0001"
    assert "| harness | numbers | overall |" in (ev / "eval.md").read_text()
    assert {r.rollout_id for r in A.read_table(ev / "rollouts.parquet", A.RolloutRecord)} == {
        f"e0001.numbers-{t}.agentloop.{i}" for t in (0, 1) for i in (0, 1)}

    out = tmp_path / "standalone"
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "eval", "--tasks", str(tmp_path / "tasks"), "--model",
                        str(run_dir / "checkpoints" / "step-0001"), "--n", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out / "eval.json").read_text())
    assert set(report["per_task"]) == {"numbers-0", "numbers-1"} and report["samples"] == {"numbers-0": 2, "numbers-1": 2}
    assert "no judge configured: code scores only" in r.stdout and "Pass@1" in r.stdout
