"""The loop chained from the shell: `clawgym sync`, the stages' `--json`, and recipes/pipeline.sh.

`recipes/pipeline.sh` runs as a real bash script that starts a real `clawgym serve-proxy` in the
background and chains real `clawgym` processes. The slow test stops it twice (SIGTERM to the script
alone, then Ctrl-C to its process group), checks that nothing it started is left running, reruns it
to the end, and then runs `clawgym run` on the same settings: both must learn alike.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from clawgym import artifacts as A
from clawgym.proxy import ProxyConfig, ProxyThread

from toy import ROOT, write_toy_recipe

PIPELINE = ROOT / "recipes" / "pipeline.sh"
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def clawgym(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clawgym.cli", *args], capture_output=True, text=True,
                          env=env or OFFLINE, timeout=600)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and r.stdout == "" and len(lines) == 1 and lines[0].startswith("error: "), (r.returncode, r.stdout, r.stderr)
    return lines[0]


# --- clawgym sync --------------------------------------------------------------------------------


@pytest.mark.slow
def test_sync_serves_the_new_version_and_fails_in_one_line(tiny_model: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # a folder that looks like a checkpoint but does not load
    cfg = ProxyConfig(model_dir=tiny_model, engine="hf", port=0, records_dir=tmp_path / "records", admin_token="secret")
    with ProxyThread(cfg) as proxy:
        url = f"http://127.0.0.1:{proxy.server.port}"
        env = {**OFFLINE, "CLAWGYM_ADMIN_TOKEN": "secret"}
        r = clawgym("sync", "--proxy", url, "--checkpoint", str(tiny_model), "--json", env=env)
        assert r.returncode == 0, r.stderr
        result = orjson.loads(r.stdout)  # stdout is the JSON object alone
        assert result["policy_version"] == 1 and result["previous_version"] == 0
        assert result["checkpoint"] == str(tiny_model.resolve()) and result["proxy"] == url
        assert proxy.server.engine.policy_version == 1
        assert f"serves {tiny_model.resolve()} as policy version 1" in r.stderr

        # human output without --json: the line on stdout
        r = clawgym("sync", "--proxy", url, "--checkpoint", str(tiny_model), env=env)
        assert r.returncode == 0 and r.stdout.strip().endswith("s)") and "policy version 2" in r.stdout

        bad_token = one_error_line(clawgym("sync", "--proxy", url, "--checkpoint", str(tiny_model),
                                           env={**OFFLINE, "CLAWGYM_ADMIN_TOKEN": "wrong"}))
        assert "refused the admin token" in bad_token
        no_token = one_error_line(clawgym("sync", "--proxy", url, "--checkpoint", str(tiny_model)))
        assert "--admin-token" in no_token and "CLAWGYM_ADMIN_TOKEN" in no_token
        not_loaded = one_error_line(clawgym("sync", "--proxy", url, "--checkpoint", str(broken), "--json", env=env))
        assert f"could not load checkpoint {broken}" in not_loaded
        missing = one_error_line(clawgym("sync", "--proxy", url, "--checkpoint", str(tmp_path / "nowhere"), env=env))
        assert "is not a directory" in missing
        # a failed reload keeps serving the weights it had
        assert proxy.server.engine.policy_version == 2

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    down = one_error_line(clawgym("sync", "--proxy", f"http://127.0.0.1:{free}", "--checkpoint", str(tiny_model), env=env))
    assert f"no proxy answers at http://127.0.0.1:{free}" in down
    usage = clawgym("sync", "--proxy", url, env=env)  # no --checkpoint
    assert usage.returncode == 2 and "--checkpoint" in usage.stderr


def test_harness_option_is_checked_in_one_line(tmp_path: Path) -> None:
    common = ("--tasks", str(ROOT / "recipes" / "tasks" / "toy"), "--out", str(tmp_path / "out"), "--model", str(tmp_path))
    assert "expects HARNESS.KEY=VALUE" in one_error_line(clawgym("rollout", *common, "--harness-option", "max_tokens=8"))
    assert "unknown harness 'agentlop'" in one_error_line(clawgym("eval", *common, "--harness-option", "agentlop.max_tokens=8"))
    assert "expects KEY=VALUE" in one_error_line(clawgym("rollout", *common, "--harness-option", "agentloop.max_tokens"))
    assert not (tmp_path / "out").exists()  # refused before anything ran


# --- recipes/pipeline.sh -------------------------------------------------------------------------

STEPS, N, TASKS, LR = 2, 4, 8, 0.03
"""2 steps of 8 toy tasks × 4 samples (32 rollouts a step) at the toy recipe's rate"""
Z = 4.0
"""how many standard errors apart two runs' mean rewards of one step may be (below)"""


def launch(run_dir: Path, log: Path) -> subprocess.Popen:
    """pipeline.sh in its own session (its pid is the session id of everything it starts)."""
    env = {**OFFLINE, "RUN_DIR": str(run_dir), "STEPS": str(STEPS), "N": str(N), "TASKS": str(run_dir.parent / "tasks"),
           "LR": str(LR), "EVAL_N": "1", "CONCURRENCY": "8", "PYTHONUNBUFFERED": "1", "COLUMNS": "250"}
    env.pop("CLAWGYM_ADMIN_TOKEN", None)
    return subprocess.Popen(["bash", str(PIPELINE)], env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_for(path: Path, proc: subprocess.Popen, log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"pipeline.sh exited {proc.returncode} before {path} appeared:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout:.0f} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)


def session(sid: int) -> list[str]:
    """The command lines of the live processes in session `sid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            pass  # the process ended while we looked
    return found


def stop(proc: subprocess.Popen, how: str, log: Path) -> None:
    """Stop the script the way a user would and check it took everything it started with it."""
    if how == "SIGTERM":  # kill PID, a CI timeout: the script alone gets it
        os.kill(proc.pid, signal.SIGTERM)
    else:  # Ctrl-C: the terminal sends SIGINT to the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=300)
    assert code == (143 if how == "SIGTERM" else 130), log.read_text()[-3000:]
    assert session(proc.pid) == [], f"left running after {how}: {session(proc.pid)}"


def rewards(step_dir: Path) -> list[float]:
    rows = A.read_table(step_dir / "rollouts.parquet", A.RolloutRecord)
    assert len(rows) == TASKS * N and all(r.reward is not None for r in rows), [(r.rollout_id, r.status, r.error) for r in rows]
    return [r.reward for r in rows]


def train_settings(ckpt: Path) -> dict:
    """The checkpoint's train config without the paths, which differ between the two runs."""
    config = orjson.loads((ckpt / "train_config.json").read_bytes())
    return {k: v for k, v in config.items() if k not in ("trees", "rollouts", "model", "out", "metrics")}


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_pipeline_stops_cleanly_resumes_and_learns_like_clawgym_run(tmp_path: Path) -> None:
    recipe = write_toy_recipe(tmp_path, "twin", steps=STEPS, n=N, tasks=TASKS, lr=LR)  # also copies the tasks
    run_dir, log = tmp_path / "pipeline", tmp_path / "pipeline.log"

    # 1. SIGTERM to the script while step 1 trains: the stage and the proxy stop with it.
    proc = launch(run_dir, log)
    wait_for(run_dir / "step-0001" / "rollout.json", proc, log)
    collected = (run_dir / "step-0001" / "rollouts.parquet").read_bytes()
    stop(proc, "SIGTERM", log)

    # 2. Rerun: step 1 resumes after its collect stage. Ctrl-C once step 1 is synced.
    proc = launch(run_dir, log)
    wait_for(run_dir / "step-0001" / "sync.json", proc, log)
    stop(proc, "Ctrl-C", log)
    assert (run_dir / "step-0001" / "rollouts.parquet").read_bytes() == collected  # not collected again

    # 3. Rerun to the end.
    proc = launch(run_dir, log)
    assert proc.wait(timeout=1800) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert "resuming: steps 1-1 are done" in text
    assert session(proc.pid) == []

    # Every stage left its JSON result; the figures agree with the tables they describe.
    for step in (1, 2):
        sdir = run_dir / f"step-{step:04d}"
        rollout = orjson.loads((sdir / "rollout.json").read_bytes())
        assert rollout["rollouts"] == rollout["scored"] == TASKS * N
        assert math.isclose(rollout["mean_reward"], statistics.fmean(rewards(sdir)))
        # the resumed proxy served step 2 as policy version 1, as an uninterrupted run would
        assert rollout["policy_versions"] == [step - 1]
        trees = orjson.loads((sdir / "trees.json").read_bytes())
        assert trees["trees"] == str((sdir / "trees.parquet").resolve()) and trees["rollouts"] == TASKS * N
        train = orjson.loads((sdir / "train.json").read_bytes())
        assert train["checkpoint"] == str((run_dir / "checkpoints" / f"step-{step:04d}").resolve()) and train["updates"] == 1
        assert orjson.loads((sdir / "sync.json").read_bytes())["policy_version"] == step
    evaluation = orjson.loads((run_dir / "eval" / "step-0002" / "result.json").read_bytes())
    assert evaluation["pass@1"] == orjson.loads((run_dir / "eval" / "step-0002" / "eval.json").read_bytes())["pass@1"]
    assert "run " + str(run_dir) in text and "eval Pass@1" in text  # clawgym inspect's per-step table

    # 4. `clawgym run` on the same settings.
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "run", str(recipe)], cwd=tmp_path, capture_output=True,
                       text=True, env=OFFLINE, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    twin = tmp_path / "runs" / "twin"

    # Same starting policy (byte for byte), same optimizer settings and seeds at every step.
    assert (run_dir / "model-init" / "model.safetensors").read_bytes() == (twin / "model-init" / "model.safetensors").read_bytes()
    for step in (1, 2):
        name = f"step-{step:04d}"
        assert train_settings(run_dir / "checkpoints" / name) == train_settings(twin / "checkpoints" / name)

    # Same rewards within sampling noise. A step's mean reward over n rollouts has standard error
    # s/√n (s: the per-rollout sample std); the two runs' means differ by less than Z standard
    # errors of the difference, √(s₁²/n₁ + s₂²/n₂), unless they sample from different policies:
    # under the same policy a normal difference passes 4 SE with probability 1 - 6e-5. Step 1
    # samples the same initial policy in both; step 2 the policy each trained on its own batch.
    for step in (1, 2):
        a, b = rewards(run_dir / f"step-{step:04d}"), rewards(twin / f"step-{step:04d}")
        se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        diff = statistics.fmean(a) - statistics.fmean(b)
        print(f"step {step}: pipeline {statistics.fmean(a):.4f} ± {statistics.stdev(a):.4f}, "
              f"clawgym run {statistics.fmean(b):.4f} ± {statistics.stdev(b):.4f}; diff {diff:+.4f} = {diff / se if se else 0:+.2f} SE")
        assert abs(diff) <= Z * se, (step, a, b)

    # 5. recipes/retrain-offline.sh replays the pipeline's optimizer at another rate, with no rollout.
    r = subprocess.run(["bash", str(ROOT / "recipes" / "retrain-offline.sh")], capture_output=True, text=True, timeout=1200,
                       env={**OFFLINE, "FROM": str(run_dir), "LR": "0.01"})
    assert r.returncode == 0, r.stderr[-3000:]
    replay = tmp_path / "pipeline-lr0.01"
    out = r.stdout.splitlines()
    assert out[0] == f"replay of {run_dir}: changes lr 0.03 → 0.01; every other train setting as the run recorded"
    header, *rows = [line.split() for line in out if line.startswith("step")]
    assert header[:6] == ["step", "update", "run", "loss", "replay", "loss"] and [row[0] for row in rows] == ["step-0001", "step-0002"]
    for step in (1, 2):
        config = orjson.loads((replay / "checkpoints" / f"step-{step:04d}" / "train_config.json").read_bytes())
        assert config["lr"] == 0.01 and config["seed"] == step and config["trees"] == str(run_dir / f"step-{step:04d}" / "trees.parquet")
    # Step 1 trains the same policy on the same batch with the same seed: the first update's loss,
    # entropy and |Δlogp| (all computed before the optimizer moves) are the run's.
    step1 = rows[0][2:]
    assert step1[0::2] == step1[1::2], r.stdout
