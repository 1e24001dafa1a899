"""What `clawgym run` prints and where its metrics go: the step reduction, the step line, the run
layout, the TensorBoard and W&B sinks, and a real run's quiet output."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from clawgym import artifacts as A
from clawgym.run.progress import cold_start_line, step_line
from clawgym.errors import UserError
from clawgym.layout import RunLayout, StepLayout, parse_step_name, step_name
from clawgym.train.step_metrics import REDUCTIONS, reduce_updates

from toy import write_toy_recipe


def update(n: int, epoch: int, **values: float) -> dict:
    return {"step": n, "time": 0.0, "train/update": float(n), "train/epoch": float(epoch), **values}


def test_a_step_of_four_updates_reduces_each_key_by_its_rule() -> None:
    # 2 epochs x 2 minibatches over a batch of 3 + 2 rollouts (5 rollouts, 30 + 20 trainable tokens)
    lines = [update(1, 0, **{"train/loss": 1.0, "train/trainable_tokens": 30, "train/rollouts": 3, "train/tokens_forwarded": 100, "train/grad_norm": 1.0}),
             update(2, 0, **{"train/loss": 2.0, "train/trainable_tokens": 20, "train/rollouts": 2, "train/tokens_forwarded": 80, "train/grad_norm": 4.0}),
             update(3, 1, **{"train/loss": 3.0, "train/trainable_tokens": 20, "train/rollouts": 2, "train/tokens_forwarded": 80, "train/grad_norm": 2.0}),
             update(4, 1, **{"train/loss": 6.0, "train/trainable_tokens": 30, "train/rollouts": 3, "train/tokens_forwarded": 100, "train/grad_norm": 1.0})]
    v = reduce_updates(lines)
    assert v["train/update"] == 4 and v["train/epoch"] == 1  # the last, not 2.5 and 0.5
    assert v["train/loss"] == 3.0  # mean
    assert v["train/trainable_tokens"] == 50 and v["train/rollouts"] == 5  # the batch once, not the last minibatch's
    assert v["train/tokens_forwarded"] == 360  # every forward of the step
    assert v["train/grad_norm"] == 2.0 and v["train/grad_norm_max"] == 4.0
    with pytest.raises(ValueError, match="'train/new_thing' has no reduction"):
        reduce_updates([update(1, 0, **{"train/new_thing": 1.0})])
    assert set(REDUCTIONS.values()) <= {"sum", "mean", "last", "max", "batch"}


def test_the_step_line_shows_reward_spread_eval_mismatch_phases_and_eta() -> None:
    values = {"rollout/reward_mean": 0.4123, "rollout/reward_std": 0.18, "eval/pass@1": 0.52, "train/mismatch_abs": 0.0012,
              "train/clip_frac": 0.0, "train/grad_norm": 1.98, "train/tokens_per_s": 2466.0, "time/collect_s": 86.2,
              "time/reconstruct_s": 1.6, "time/optimize_s": 5.0, "time/sync_s": 0.7, "time/eval_s": 20.0,
              "trees/tree_token_ratio": 0.357, "trees/tokens_saved": 49040.0}
    line = step_line(3, 8, values, eta_s=492)
    assert line == ("step 3/8  reward 0.412 ± 0.180  pass@1 52.0%  mismatch 0.0012  clip 0.000  grad 1.98  2,466 tok/s"
                    "  tree 0.36 (49,040 tok saved) | rollout 1m26s  trees 2s  train 5s  sync 1s  eval 20s | ETA 8m12s")
    cached = step_line(3, 8, {**values, "proxy/prefix_hit_rate": 0.912, "proxy/prompt_computed_share": 0.088}, eta_s=None)
    assert "  tree 0.36 (49,040 tok saved)  prefix cache 91% hit, 9% computed | rollout" in cached
    peaks = step_line(3, 8, {**values, "memory/collect_peak_gib": 2.13, "memory/optimize_peak_gib": 4.21}, eta_s=492)
    assert peaks.endswith("| rollout 1m26s  trees 2s  train 5s  sync 1s  eval 20s | peak GiB rollout 2.1  train 4.2 | ETA 8m12s")
    with_kl = step_line(1, 1, {**values, "train/kl_ref": 0.25}, eta_s=None)
    assert "kl 0.2500" in with_kl and "mismatch" not in with_kl and "ETA" not in with_kl
    sft = {"rollout/teacher_reward_mean": 1.0, "train/sft_loss_first": 2.5, "train/sft_loss_last": 0.5,
           "eval/base/pass@1": 0.1, "eval/pass@1": 0.8}
    assert cold_start_line(sft) == "step 0 (SFT cold start)  teacher reward 1.000  sft loss 2.500 → 0.500  pass@1 10.0% → 80.0%"


def test_a_steps_engine_figures_are_the_counters_differences_around_its_rollouts() -> None:
    from clawgym.run.metrics import engine_values

    before = {"prompt_tokens": 1000.0, "prompt_tokens_cached": 600.0, "prompt_tokens_computed": 400.0,
              "prefill_seconds": 5.0, "decode_seconds": 10.0, "decode_tokens": 100.0}
    after = {"prompt_tokens": 3000.0, "prompt_tokens_cached": 2400.0, "prompt_tokens_computed": 600.0,
             "prefill_seconds": 8.0, "decode_seconds": 30.0, "decode_tokens": 500.0}
    assert engine_values(before, after) == pytest.approx({
        "proxy/prefix_hit_rate": 0.9, "proxy/prompt_computed_share": 0.1,  # of the step's 2,000 prompt tokens
        "proxy/prefill_s": 3.0, "proxy/decode_s": 20.0, "proxy/decode_tok_s": 20.0})  # 400 tokens in 20 s
    # no prompt sent: no shares; no decode forward: no speed; an engine without the counters: nothing
    idle = engine_values(after, {**after, "prefill_seconds": 9.0})
    assert idle == {"proxy/prefill_s": 1.0, "proxy/decode_s": 0.0}
    assert engine_values({}, {}) == {}


def test_the_run_layout_names_every_path_once(tmp_path: Path) -> None:
    run = RunLayout(tmp_path / "r")
    s = run.step(3)
    assert s.path == tmp_path / "r" / "step-0003" and s.step == 3 and s.checkpoint == tmp_path / "r" / "checkpoints" / "step-0003"
    assert (s.calls.name, s.rollouts.name, s.trees.name, s.trees_config.name, s.train_metrics.name, s.results.name,
            s.transcripts.name, s.records.name, s.rollout_config.name) == (
        "calls.parquet", "rollouts.parquet", "trees.parquet", "trees.config.json", "train.jsonl", "results.jsonl",
        "transcripts.jsonl", "records", "rollout.config.json")
    assert run.eval(3).eval_json == tmp_path / "r" / "eval" / "step-0003" / "eval.json"
    assert run.eval("base").path == tmp_path / "r" / "eval" / "base" and run.sft.checkpoint == run.checkpoints / "sft"
    assert (run.metrics.name, run.recipe.name, run.model_init.name) == ("metrics.jsonl", "recipe.toml", "model-init")
    for n in (10, 2):
        run.step(n).path.mkdir(parents=True)
    (run.root / "step-x").mkdir()
    assert [x.step for x in run.steps()] == [2, 10]
    assert run.step(2).in_run() == (run, 2) and StepLayout(tmp_path).in_run() is None
    assert parse_step_name(step_name(12)) == 12 and parse_step_name("sft") is None


def _toy_line(step: int, reward: float) -> A.MetricsLine:
    return A.MetricsLine(step, {"rollout/reward_mean": reward, "train/loss": -reward}, time=1000.0 + step)


@pytest.mark.slow
def test_tensorboard_sink_writes_event_files_tensorboard_reads_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from clawgym.run.sinks import close_sinks, open_sinks

    run = RunLayout(tmp_path)
    sinks = open_sinks(run, tensorboard=True, wandb={}, name="t", first_step=1, config={})
    for step, reward in ((1, 0.25), (2, 0.5)):
        sinks[0].write(_toy_line(step, reward))
    close_sinks(sinks)
    acc = EventAccumulator(str(run.tensorboard))
    acc.Reload()
    assert {"rollout/reward_mean", "train/loss"} <= set(acc.Tags()["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("rollout/reward_mean")] == [(1, 0.25), (2, 0.5)]


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file, read with W&B's own protobuf records.

    The file is a 7-byte W&B header, then LevelDB log blocks of 32 KiB: records of a 7-byte header
    (crc32c, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) and their payload."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, rows, pending = run_file.read_bytes(), 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - (pos - 7) % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - (pos - 7) % 32768
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(pending)
            pending = b""
            if rec.WhichOneof("record_type") == "history":
                import json

                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item})
    return rows


@pytest.mark.slow
def test_wandb_sink_runs_offline_inside_the_run_directory(tmp_path: Path, monkeypatch) -> None:
    from clawgym.run.sinks import close_sinks, open_sinks

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # nothing may land in the home directory
    run = RunLayout(tmp_path / "run")
    run.root.mkdir()
    sinks = open_sinks(run, tensorboard=False, wandb={"project": "clawgym-test", "mode": "offline"}, name="t",
                       first_step=1, config={"lr": 0.03})
    for step, reward in ((1, 0.25), (2, 0.5)):
        sinks[0].write(_toy_line(step, reward))
    close_sinks(sinks)
    files = list(run.wandb.glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    rows = [r for r in wandb_history(files[0]) if "rollout/reward_mean" in r]
    assert [(r["_step"], r["rollout/reward_mean"], r["train/loss"]) for r in rows] == [(1, 0.25, -0.25), (2, 0.5, -0.5)]
    assert not (tmp_path / "home").exists()


def test_a_sink_whose_package_is_missing_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    from clawgym.run.sinks import open_sinks

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(UserError, match=r"^\[log\] tensorboard needs the tensorboard package .*pip install 'clawgym\[tensorboard\]'$"):
        open_sinks(RunLayout(tmp_path), tensorboard=True, wandb={}, name="t", first_step=1, config={})
    with pytest.raises(UserError, match=r"pip install 'clawgym\[wandb\]'"):
        open_sinks(RunLayout(tmp_path), tensorboard=False, wandb={"project": "p"}, name="t", first_step=1, config={})


@pytest.mark.parametrize("body,message", [
    ("[log]\ntensorboard = 'yes'\n", r"\[log\] key 'tensorboard' must be bool"),
    ("[log]\nwandb = {mode = 'offline'}\n", r"\[log\] key 'wandb' needs a project"),
    ("[log]\nwandb = {project = 'p', mode = 'cloud'}\n", r"\[log\] key 'wandb.mode' must be one of offline, online, disabled"),
    ("[log]\nwandb = {project = 'p', colour = 'red'}\n", r"\[log\] key 'wandb': unknown key 'colour'"),
    ("[log]\nwandb = {project = 3}\n", r"\[log\] key 'wandb.project' must be str"),
])
def test_log_section_errors_name_the_key(tmp_path: Path, body: str, message: str) -> None:
    from clawgym.run.recipe import load_recipe

    (tmp_path / "tasks").mkdir()
    path = tmp_path / "r.toml"
    path.write_text('[model]\ninit = "tiny"\n\n[rollout]\ntasks = "tasks"\n' + body)
    with pytest.raises(UserError, match=message):
        load_recipe(path)


def test_log_section_round_trips_and_is_absent_by_default(tmp_path: Path) -> None:
    from clawgym.run.recipe import load_recipe, recipe_to_toml

    (tmp_path / "tasks").mkdir()
    path = tmp_path / "r.toml"
    path.write_text('[model]\ninit = "tiny"\n\n[rollout]\ntasks = "tasks"\n')
    assert "[log]" not in recipe_to_toml(load_recipe(path))  # runs started before [log] existed still resume
    path.write_text(path.read_text() + '\n[log]\ntensorboard = true\nwandb = {project = "p", mode = "offline"}\n')
    r = load_recipe(path)
    assert r.log.tensorboard and r.log.wandb == {"project": "p", "mode": "offline"}
    again = tmp_path / "again.toml"
    again.write_text(recipe_to_toml(r))
    assert load_recipe(again).log == r.log


@pytest.mark.slow
def test_a_run_prints_one_line_per_step_and_feeds_every_sink(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # PPO: every rollout carries a signal, so each step has its 4 updates whatever the rewards
    # (a GRPO group of equal rewards has nothing to learn, and a 2-rollout group often has).
    recipe = write_toy_recipe(tmp_path, "out", algo="ppo", steps=2, n=2, tasks=2, max_tokens=4, concurrency=4,
                              train_extra="epochs = 2\nminibatches = 2")
    recipe.write_text(recipe.read_text() + '\n[eval]\nevery = 2\nsamples_per_task = 1\n\n[log]\ntensorboard = true\n'
                      'wandb = {project = "clawgym-test", mode = "offline"}\n')
    proc = subprocess.run([sys.executable, "-m", "clawgym.cli", "run", str(recipe)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("2 steps; last mean reward") and len(proc.stdout.splitlines()) == 1
    step_lines = [ln for ln in proc.stderr.splitlines() if re.match(r"step \d/2  reward \d\.\d{3} ± \d\.\d{3}", ln)]
    assert len(step_lines) == 2, proc.stderr
    assert " | rollout " in step_lines[0] and " train " in step_lines[0] and "ETA" in step_lines[0]
    assert re.search(r"  tree \d\.\d\d \([\d,]+ tok saved\)  prefix cache \d+% hit, \d+% computed \| ", step_lines[0]), step_lines[0]
    assert "pass@1 " in step_lines[1] and " eval " in step_lines[1]
    for table in ("trees per rollout", "train grpo:", "update 1 |", "Pass@1 (%) by category"):
        assert table not in proc.stderr  # only with --verbose

    run = RunLayout(tmp_path / "runs" / "out")
    metrics = A.read_metrics(run.metrics)
    assert [m.step for m in metrics] == [1, 2]
    for m in metrics:  # several updates per step: each key reduced by its rule
        updates = A.read_jsonl(run.step(m.step).train_metrics).records
        assert len(updates) == 4 and m.values["train/update"] == 4 and m.values["train/epoch"] == 1
        assert m.values["train/trainable_tokens"] == sum(u["train/trainable_tokens"] for u in updates if u["train/epoch"] == 1)
        assert m.values["train/tokens_forwarded"] == sum(u["train/tokens_forwarded"] for u in updates)
        assert m.values["train/loss"] == pytest.approx(sum(u["train/loss"] for u in updates) / 4)
        # the hf engine's prefix cache: two samples of a task share their prompt, so some of it is served
        hit, computed = m.values["proxy/prefix_hit_rate"], m.values["proxy/prompt_computed_share"]
        assert 0 < hit < 1 and hit + computed >= 1 - 1e-9, (hit, computed)
        # and how long its forwards took: the rollouts prefilled and decoded
        assert m.values["proxy/prefill_s"] > 0 and m.values["proxy/decode_s"] > 0 and m.values["proxy/decode_tok_s"] > 0
    acc = EventAccumulator(str(run.tensorboard))
    acc.Reload()
    # TensorBoard stores scalars as float32, so the value matches to float32 precision, not to 6 decimals
    scalars = acc.Scalars("rollout/reward_mean")
    assert [e.step for e in scalars] == [m.step for m in metrics]
    assert [e.value for e in scalars] == pytest.approx([m.values["rollout/reward_mean"] for m in metrics], rel=1e-6)
    files = list(run.wandb.glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    logged = [r for r in wandb_history(files[0]) if "rollout/reward_mean" in r]
    assert [r["_step"] for r in logged] == [1, 2] and logged[1]["eval/pass@1"] == metrics[1].values["eval/pass@1"]
