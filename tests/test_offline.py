"""Offline re-training (`clawgym replay`, recipes/retrain-offline.sh, `[offline]` recipes): at the run's own
settings a replay writes the run's checkpoints again; an override changes only what it names.

The run is made of the real stages: multi-turn agentloop rollouts through the proxy (the teacher
engine plays the model, so every rollout makes several calls that share their prompts), build-trees,
then two `train` steps chained as recipes/pipeline.sh chains them (each from the previous checkpoint,
its optimizer state and value model included), with `minibatches = 2`. The teacher solves every task,
so the rewards are set apart within each group afterwards: GRPO needs groups that are not flat.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from clawgym import artifacts as A
from clawgym.errors import UserError
from clawgym.layout import RunLayout
from clawgym.run.replay import change_line, comparison, parse_overrides, run_steps

ROOT = Path(__file__).resolve().parents[1]


def replay(*args: str) -> subprocess.CompletedProcess:
    """`clawgym replay ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "clawgym.cli", "replay", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


QUIET = Console(stderr=True, quiet=True)
STEPS = 2


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> list[Path]:
    """Two steps' batches (rollouts.parquet + trees.parquet) of multi-turn rollouts, rewards spread within each group."""
    from clawgym.rollout.runner import RolloutConfig, run_rollouts
    from clawgym.tasks.families import make_tasks
    from clawgym.trees import resolve_config, run_build_trees

    base = tmp_path_factory.mktemp("offline-batches")
    make_tasks("lookup", base / "tasks", n=2, seed=0, split="train")
    first = base / "b1"
    run_rollouts(RolloutConfig(tasks=base / "tasks", harnesses=["agentloop"], out=first, group_size=3, concurrency=3, model=tiny_model,
                               engine="teacher", engine_options={"family": "lookup"}, timeout_s=120,
                               harness_options={"agentloop": {"max_turns": 4, "max_tokens": 64}}), QUIET)
    run_build_trees(resolve_config(first, None, None, None, 64, first / "trees.metrics.jsonl", 1), QUIET)
    calls = A.read_table(first / "calls.parquet", A.CallRecord)
    assert len(calls) > len(A.read_table(first / "rollouts.parquet", A.RolloutRecord))  # multi-turn: several calls each
    out = []
    for step in range(1, STEPS + 1):
        sdir = base / f"b{step}"
        if step > 1:
            sdir.mkdir()
            shutil.copy2(first / "trees.parquet", sdir / "trees.parquet")
        rows = sorted(A.read_table(first / "rollouts.parquet", A.RolloutRecord), key=lambda r: r.rollout_id)
        rows = [dataclasses.replace(r, reward=float((i + step) % 3 == 0)) for i, r in enumerate(rows)]
        A.write_table(sdir / "rollouts.parquet", rows, A.RolloutRecord)
        out.append(sdir)
    return out


def make_run(root: Path, batches: list[Path], model: Path, algo: str) -> RunLayout:
    """A finished run as recipes/pipeline.sh leaves it: step k trains from step k−1's checkpoint with seed k."""
    from clawgym.train.loop import TrainConfig, train

    run = RunLayout(root)
    shutil.copytree(model, run.model_init)
    policy = run.model_init
    for step, batch in enumerate(batches, 1):
        sdir = run.step(step)
        sdir.path.mkdir(parents=True)
        for name in ("trees.parquet", "rollouts.parquet"):
            shutil.copy2(batch / name, sdir.path / name)
        train(TrainConfig(trees=sdir.trees, rollouts=sdir.rollouts, model=policy, out=sdir.checkpoint, algo=algo,
                          lr=0.01, value_lr=0.01, minibatches=2, seed=step,
                          resume=True), QUIET)
        policy = sdir.checkpoint
    return run


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """Every tensor a checkpoint holds that the next step starts from: policy, AdamW state, PPO value model."""
    out = {f"lm.{k}": v for k, v in load_file(ckpt / "model.safetensors").items()}
    for part in ("", "value/"):
        if (ckpt / part / "optimizer.pt").exists():
            state = torch.load(ckpt / part / "optimizer.pt", weights_only=True)["state"]
            out.update({f"{part}opt.{i}.{k}": v for i, s in state.items() for k, v in s.items()})
    if (ckpt / "value").is_dir():
        for f in sorted((ckpt / "value").glob("*.safetensors")):
            out.update({f"value.{f.name}.{k}": v for k, v in load_file(f).items()})
    return out


def assert_same(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k].float(), wb[k].float(), rtol=1e-5, atol=1e-6), f"{a} vs {b}: {k} differs"


def assert_moved(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert any(not torch.allclose(wa[k].float(), wb[k].float(), rtol=1e-5, atol=1e-6) for k in wa if k.startswith("lm."))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_grpo_replay_at_the_runs_settings_writes_the_runs_checkpoints_and_an_lr_changes_only_the_lr(
        batches: list[Path], tiny_model: Path, tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path / "run", batches, tiny_model, "grpo")
    assert run_steps(run) == [1, 2]
    r = replay(str(run.root), str(tmp_path / "same"))
    assert r.returncode == 0, r.stderr[-3000:]
    printed = r.stdout
    assert printed.splitlines()[0].startswith(f"replay of {run.root}: changes nothing; every train setting as the run recorded "
                                              "(grpo, lr 0.01, 1 epoch(s) × 2 minibatch(es)")
    for step in (1, 2):
        assert_same(run.step(step).checkpoint, RunLayout(tmp_path / "same").step(step).checkpoint)
        # the replay trained with the recorded settings (minibatches = 2: two updates per step), not train's defaults
        cfg = json.loads((RunLayout(tmp_path / "same").step(step).checkpoint / "train_config.json").read_text())
        assert (cfg["minibatches"], cfg["lr"], cfg["seed"], cfg["algo"]) == (2, 0.01, step, "grpo")
    # The table: distinct headers though the rates are equal, one row per update, equal figures.
    assert "per update: each row is one optimizer step of each" in printed
    header = next(line for line in printed.splitlines() if line.startswith("step "))
    assert "run loss" in header and "replay loss" in header and "run entropy" in header and "replay |Δlogp|" in header
    rows = [line.split() for line in printed.splitlines() if line.startswith("step-0")]
    assert [r[:2] for r in rows] == [["step-0001", "1"], ["step-0001", "2"], ["step-0002", "1"], ["step-0002", "2"]]
    for r in rows:
        assert [float(x) for x in r[2::2]] == pytest.approx([float(x) for x in r[3::2]], rel=1e-4, abs=1e-6)

    # LR=0.05 through the script: the one line names the change, the replay's step 1 moves off the
    # run's, every other setting stays.
    r = subprocess.run(["bash", str(ROOT / "recipes" / "retrain-offline.sh")], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "FROM": str(run.root), "LR": "0.05"})
    assert r.returncode == 0, r.stderr[-3000:]
    printed = r.stdout
    other = RunLayout(f"{run.root}-lr0.05")
    assert printed.splitlines()[0] == f"replay of {run.root}: changes lr 0.01 → 0.05; every other train setting as the run recorded"
    assert_moved(run.step(1).checkpoint, other.step(1).checkpoint)
    cfg = json.loads((other.step(2).checkpoint / "train_config.json").read_text())
    assert (cfg["minibatches"], cfg["lr"], cfg["seed"]) == (2, 0.05, 2)
    # Rerunning the same replay resumes (nothing to train); another rate into the same folder is refused.
    again = replay(str(run.root), str(other.root), "lr=0.05", "--json")
    assert again.returncode == 0 and again.stderr.count("already complete") == 2, again.stderr
    data = json.loads(again.stdout)  # --json: one object on stdout, the tables on stderr
    assert data["steps"] == [1, 2] and data["changes"] == {"lr": 0.05} and data["out"] == str(other.root.resolve())
    refused = replay(str(run.root), str(other.root), "lr=0.02")
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"error: {other.step(1).checkpoint} was trained with other settings (lr 0.05); choose another output folder or remove it")
    forced = replay(str(run.root), str(other.root), "lr=0.02", "--force")  # --force replays it anew
    assert forced.returncode == 0 and json.loads((other.step(1).checkpoint / "train_config.json").read_text())["lr"] == 0.02
    assert f"run: {run.root} (grpo, lr 0.01," in printed and f"replay: {other.root} (grpo, lr 0.05," in printed



@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ppo_offline_recipe_replays_policy_value_model_and_both_optimizers(batches: list[Path], tiny_model: Path,
                                                                           tmp_path: Path) -> None:
    from clawgym.run.loop import run as run_loop

    run = make_run(tmp_path / "run", batches, tiny_model, "ppo")
    assert (run.step(2).checkpoint / "value" / "optimizer.pt").exists()
    recipe = tmp_path / "offline.toml"  # no [model], no [train]: everything as the run recorded
    recipe.write_text(f'[run]\nname = "again"\nsteps = {STEPS}\n\n[offline]\nfrom_run = "run"\n')
    console = Console(stderr=True, record=True, width=400)
    run_loop(recipe, console=console)
    again = RunLayout(tmp_path / "runs" / "again")
    assert f"replay of {run.root}: changes nothing" in console.export_text()
    for step in (1, 2):
        assert_same(run.step(step).checkpoint, again.step(step).checkpoint)
        cfg = json.loads((again.step(step).checkpoint / "train_config.json").read_text())
        assert (cfg["algo"], cfg["minibatches"], cfg["value_lr"], cfg["seed"]) == ("ppo", 2, 0.01, step)
    assert "per update" in comparison(run.root, again.root)


def test_overrides_are_typed_and_checked() -> None:
    assert parse_overrides(["lr=1", "algo=ppo", "minibatches=4", "share_prefixes=false"]) == {
        "lr": 1.0, "algo": "ppo", "minibatches": 4, "share_prefixes": False}
    assert parse_overrides({"ref_model": "/m"}) == {"ref_model": Path("/m")}
    with pytest.raises(UserError, match="unknown train setting 'learning_rate'; known: .*lr"):
        parse_overrides(["learning_rate=0.1"])
    with pytest.raises(UserError, match="unknown train setting 'out'"):
        parse_overrides(["out=/tmp/x"])
    with pytest.raises(UserError, match="train setting 'minibatches' must be int, got str 'two'"):
        parse_overrides(["minibatches=two"])
    with pytest.raises(UserError, match="expects KEY=VALUE"):
        parse_overrides(["lr"])


def fake_step(run: RunLayout, step: int, config: dict, losses: list[float]) -> None:
    """A trained step's files as `train` leaves them: the config beside the checkpoint, one train.jsonl line per update."""
    sdir = run.step(step)
    sdir.checkpoint.mkdir(parents=True, exist_ok=True)
    (sdir.checkpoint / "train_config.json").write_text(json.dumps(config))
    sdir.path.mkdir(parents=True, exist_ok=True)
    for name in ("trees.parquet", "rollouts.parquet"):
        (sdir.path / name).touch()
    sdir.train_metrics.write_text("".join(json.dumps({"step": k + 1, "time": 0.0, "train/loss": v, "train/entropy": 1.0,
                                                      "train/mismatch_abs": 0.0, "train/epoch": 0.0}) + "\n"
                                          for k, v in enumerate(losses)))


def test_the_change_line_and_the_table_from_recorded_files(tmp_path: Path) -> None:
    run, other = RunLayout(tmp_path / "run"), RunLayout(tmp_path / "other")
    base = {"algo": "grpo", "lr": 0.03, "epochs": 1, "minibatches": 2, "seed": 1, "model": str(tmp_path / "m")}
    for step in (1, 2):
        fake_step(run, step, {**base, "seed": step}, [0.5, 0.25])
        fake_step(other, step, {**base, "seed": step, "lr": 0.03}, [0.5, 0.125])
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert change_line(run, [1, 2], {"lr": 0.03}) .startswith(f"replay of {run.root}: changes nothing")
    assert change_line(run, [1, 2], {"lr": 0.01, "seed": 7}) == (
        f"replay of {run.root}: changes lr 0.03 → 0.01; seed 1/2 → 7; every other train setting as the run recorded")
    table = comparison(run.root, other.root)
    shown = replay(str(run.root), "--table", str(other.root))  # the table alone, labelled by folder name; nothing trained
    assert shown.returncode == 0 and shown.stdout.rstrip("\n") == comparison(run.root, other.root, ("run", "other"))
    assert replay(str(run.root), "--table", str(other.root), "lr=0.1").returncode == 1
    lines = table.splitlines()
    assert lines[0] == f"run: {run.root} (grpo, lr 0.03, 1 epoch(s) × 2 minibatch(es))"
    assert lines[1] == f"replay: {other.root} (grpo, lr 0.03, 1 epoch(s) × 2 minibatch(es))"
    rows = [line.split() for line in lines if line.startswith("step-0")]
    assert lines[2] == "per update: each row is one optimizer step of each"
    assert rows[1][:4] == ["step-0001", "2", "0.25", "0.125"]
    assert len(rows) == 4
    # minibatches = 1 made one update per step where the run made two: the table compares per step, means of the updates.
    fewer = RunLayout(tmp_path / "fewer")
    for step in (1, 2):
        fake_step(fewer, step, {**base, "seed": step, "minibatches": 1}, [0.5])
    lines = comparison(run.root, fewer.root, ("a", "b")).splitlines()
    assert lines[2] == "per step: each figure is the mean over the step's updates (the two made different numbers of updates)"
    assert lines[3].split()[:4] == ["step", "updates", "a", "loss"]
    assert [line.split()[:4] for line in lines if line.startswith("step-0")] == [["step-0001", "2/1", "0.375", "0.5"],
                                                                                 ["step-0002", "2/1", "0.375", "0.5"]]


def test_the_replay_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    def cli(*args: str) -> tuple[int, str]:
        r = replay(*args)
        return r.returncode, r.stderr.strip()

    assert cli(str(tmp_path / "nope")) == (1, f"error: {tmp_path / 'nope'}: no such run directory")
    (tmp_path / "empty").mkdir()
    assert cli(str(tmp_path / "empty"), "lr=0.1") == (1, f"error: {tmp_path / 'empty'}: no step-0001/trees.parquet to retrain on "
                                                        "(not a finished run?)")
    assert cli(str(tmp_path / "empty"), "lr=fast") == (1, "error: train setting 'lr' must be float, got str 'fast'")
    assert cli(str(tmp_path / "empty"), "epochs=x") == (1, "error: train setting 'epochs' must be int, got str 'x'")
    rc, err = cli()
    assert rc == 2 and "Missing argument 'RUN'" in err
    fake_step(RunLayout(tmp_path / "gone"), 1, {"algo": "grpo", "lr": 0.1, "model": str(tmp_path / "missing")}, [])
    rc, err = cli(str(tmp_path / "gone"))
    assert rc == 1 and "the run's starting policy is gone; give the replay a starting policy" in err
    rc, err = cli(str(tmp_path / "gone"), "--model", str(tmp_path / "missing"))
    assert rc == 1 and err == f"error: {tmp_path / 'missing'}: not a model directory (no config.json)"
    rc, err = cli(str(tmp_path / "gone"), str(tmp_path / "gone"))
    assert rc == 1 and err == f"error: {tmp_path / 'gone'}: the replay would overwrite the run it replays; choose another folder"
    assert not (tmp_path / "gone-replay").exists()  # each refusal before anything is written


def test_an_offline_recipe_may_leave_the_model_to_the_run_and_no_other_may(tmp_path: Path) -> None:
    from clawgym.run.recipe import load_recipe

    (tmp_path / "runs" / "done").mkdir(parents=True)
    recipe = tmp_path / "r.toml"
    recipe.write_text('[run]\nname = "again"\nsteps = 1\n\n[offline]\nfrom_run = "runs/done"\n\n[train]\nlr = 0.1\n')
    r = load_recipe(recipe)
    assert r.model.path is None and r.model.init is None and r.train == {"lr": 0.1}
    recipe.write_text('[run]\nname = "fresh"\n\n[rollout]\ntasks = "runs"\n')
    with pytest.raises(UserError, match=r"\[model\]: give exactly one of 'path' .* an \[offline\] recipe may give neither"):
        load_recipe(recipe)


def test_recorded_settings_fall_back_to_the_runs_recipe(tmp_path: Path) -> None:
    from clawgym.run.replay import recorded, train_kwargs

    run = RunLayout(tmp_path / "run")
    run.step(1).path.mkdir(parents=True)
    run.recipe.write_text('[run]\nseed = 3\n\n[train]\nlr = 0.2\nminibatches = 2\ntoken_budget = 4096\n')
    got = recorded(run, 1)
    assert (got["lr"], got["minibatches"], got["seed"], got["epochs"], got["model"]) == (0.2, 2, 4, 1, str(run.model_init))
    assert recorded(run, 2)["model"] == str(run.step(1).checkpoint) and recorded(run, 2)["seed"] == 5
    # A train_config.json written when numbers under secret-looking names were redacted: the recipe's value.
    run.step(1).checkpoint.mkdir(parents=True)
    (run.step(1).checkpoint / "train_config.json").write_text(json.dumps({"lr": 0.5, "token_budget": "<redacted>", "seed": 9}))
    assert train_kwargs(run, 1, {"algo": "ppo"}) == {**train_kwargs(run, 1, {}), "algo": "ppo"}
    kw = train_kwargs(run, 1, {})
    assert (kw["lr"], kw["token_budget"], kw["seed"], kw["minibatches"]) == (0.5, 4096, 9, 1)
    assert "model" not in kw and "out" not in kw
    run.recipe.unlink()
    with pytest.raises(UserError, match="step 2 has no checkpoints/step-0002/train_config.json and the run no recipe.toml"):
        recorded(run, 2)
