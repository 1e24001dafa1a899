"""An asynchronous run ([run] max_staleness = K >= 1): the next step's rollouts overlap this step's
training, every call records the version that sampled it, the trainer holds each group to the
bound (whole groups left out, never split) and refuses tokens without behaviour logprobs, and the
step line, metrics.jsonl and `inspect` carry the versions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clawgym import artifacts as A
from clawgym.errors import UserError
from clawgym.run import metrics as M
from clawgym.train.staleness import call_versions, stale_groups
from toy import write_toy_recipe


def _row(rid: str, group: str) -> A.RolloutRecord:
    return A.RolloutRecord(rollout_id=rid, task_id=group, harness="agentloop", group_id=group, sample_index=0, status="ok",
                           reward=1.0, n_calls=1, wall_time_s=1.0, policy_version=0)


def test_a_group_with_one_call_too_old_is_left_out_whole(tmp_path: Path) -> None:
    calls = tmp_path / "calls.parquet"
    pq.write_table(pa.table({"rollout_id": ["a1", "a1", "a2", "b1", "b2"], "policy_version": [3, 1, 3, 2, 3]}), calls)
    versions = call_versions(calls)
    assert versions == {"a1": (1, 3), "a2": (3, 3), "b1": (2, 2), "b2": (3, 3)}
    rollouts = {r: _row(r, r[0]) for r in versions}
    assert stale_groups(rollouts, versions, trainer_version=3, max_staleness=1) == {"a"}  # a1's call of version 1
    assert stale_groups(rollouts, versions, trainer_version=3, max_staleness=2) == set()
    assert stale_groups(rollouts, versions, trainer_version=4, max_staleness=1) == {"a", "b"}


def test_the_train_settings_of_an_asynchronous_step_are_checked() -> None:
    from clawgym.train.config import TrainConfig

    base = dict(trees=Path("t"), rollouts=Path("r"), model=Path("m"), out=Path("o"))
    TrainConfig(**base, max_staleness=1, policy_version=3).validate()
    with pytest.raises(UserError, match="--max-staleness must be 0 or more, with --policy-version"):
        TrainConfig(**base, max_staleness=1).validate()
    with pytest.raises(UserError, match="not --tis off"):
        TrainConfig(**base, max_staleness=1, policy_version=3, tis="off").validate()


def test_a_recipe_refuses_an_asynchronous_run_it_cannot_make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clawgym.run import recipe as config
    from clawgym.run.recipe import load_recipe

    recipe = write_toy_recipe(tmp_path, "refused", steps=1, n=2, tasks=1)
    load_recipe(recipe, ["run.max_staleness=1"])
    monkeypatch.setattr(config, "RELOADS_IN_PLACE", frozenset({"vllm"}))  # an engine that restarts to take weights
    with pytest.raises(UserError, match="the 'hf' engine cannot take new weights while it serves"):
        load_recipe(recipe, ["run.max_staleness=1"])
    monkeypatch.undo()
    (tmp_path / "runs" / "old").mkdir(parents=True)
    with pytest.raises(UserError, match="an \\[offline\\] recipe collects no rollouts"):
        load_recipe(recipe, ["run.max_staleness=1", f"offline.from_run={tmp_path / 'runs' / 'old'}"])
    with pytest.raises(UserError, match="not --tis off"):
        from clawgym.run.checks import check_runnable

        check_runnable(load_recipe(recipe, ["run.max_staleness=1", "train.tis=off"]))
    assert load_recipe(recipe, ["run.max_staleness=2"]).train_config(3, Path("m")).policy_version == 2


@pytest.fixture(scope="module")
def async_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[A.MetricsLine]]:
    from clawgym.run.loop import run

    tmp = tmp_path_factory.mktemp("async")
    recipe = write_toy_recipe(tmp, "async", steps=3, n=4, tasks=2, max_tokens=4, concurrency=4)
    return tmp / "runs" / "async", run(recipe, overrides=["run.max_staleness=1"])


@pytest.mark.slow
def test_the_next_steps_rollouts_run_while_this_step_trains_within_the_bound(async_run) -> None:
    run_dir, lines = async_run
    assert [m.step for m in lines] == [1, 2, 3]
    for m in lines:
        calls = A.read_table(run_dir / f"step-{m.step:04d}" / "calls.parquet", A.CallRecord)
        versions = {c.policy_version for c in calls}
        assert versions and all(m.step - 1 - 1 <= v <= m.step - 1 for v in versions), (m.step, versions)
        assert (m.values[M.VERSION_MIN], m.values[M.VERSION_MAX]) == (min(versions), max(versions))
        assert m.values[M.STALE_GROUPS] == 0 and m.values[M.GROUPS] == 2
        assert m.values[M.STALENESS_MAX] == m.step - 1 - min(versions) <= 1
    # steps 2 and 3 were collected while the step before trained: each began while the proxy still
    # served the version before (a rollout records the version served when its collection began)
    for step in (2, 3):
        assert {r.policy_version for r in A.read_table(run_dir / f"step-{step:04d}" / "rollouts.parquet", A.RolloutRecord)} \
            == {step - 2}
    recorded = json.loads((run_dir / "checkpoints" / "step-0002" / "train_config.json").read_text())
    assert (recorded["max_staleness"], recorded["policy_version"]) == (1, 1)


@pytest.mark.slow
def test_the_trainer_leaves_out_what_the_bound_refuses_and_tokens_without_behaviour_logprobs(async_run) -> None:
    from clawgym.train.batch import choose, require_behaviour_logprobs
    from clawgym.train.config import TrainConfig

    run_dir, _ = async_run
    sdir = run_dir / "step-0002"
    cfg = TrainConfig(trees=sdir / "trees.parquet", rollouts=sdir / "rollouts.parquet", model=Path("m"), out=Path("o"),
                      max_staleness=1, policy_version=1)
    kept = choose(cfg)
    assert kept.stale_groups == 0 and kept.rollout_ids
    rollouts = {r.rollout_id: r for r in A.read_table(cfg.rollouts, A.RolloutRecord)}
    old = {rollouts[rid].group_id for rid, (lo, _) in call_versions(sdir / "calls.parquet").items() if lo < 1}
    strict = choose(dataclasses.replace(cfg, max_staleness=0))  # only version-1 calls may train at version 1
    assert strict.stale_groups == len(old)
    assert {rollouts[rid].group_id for rid in strict.rollout_ids}.isdisjoint(old)
    node = next(n for n in kept.nodes[kept.rollout_ids[0]] if n.trainable)
    bare = {kept.rollout_ids[0]: [dataclasses.replace(node, logprobs=[])]}
    with pytest.raises(UserError, match="behaviour logprobs were recorded"):
        require_behaviour_logprobs(bare, [kept.rollout_ids[0]])


@pytest.mark.slow
def test_the_step_line_and_inspect_show_the_versions(async_run) -> None:
    from rich.console import Console

    from clawgym.run.inspection import inspect_run
    from clawgym.run.progress import step_line

    run_dir, lines = async_run
    assert f" v {lines[1].values[M.VERSION_MIN]:.0f}-{lines[1].values[M.VERSION_MAX]:.0f} " in step_line(2, 3, lines[1].values, None)
    stale = {**lines[1].values, M.STALE_GROUPS: 2.0, M.GROUPS: 3.0}
    assert "stale 2/3 groups dropped (most: raise [run] max_staleness" in step_line(2, 3, stale, None)
    console = Console(record=True, width=300)
    inspect_run(run_dir, console)
    text = console.export_text()
    assert "v min" in text and "v max" in text and "stale groups" in text
    assert (run_dir / "plots" / "staleness.png").stat().st_size > 0


def _scripted_async(tmp: Path, name: str) -> Path:
    """The toy recipe at max_staleness 1 with a scripted engine: each rollout its own answer (a
    per-rollout script, so any order of calls gives the same rollouts) after a delay that grows with
    its index, so that a step's collection finishes some rollouts well before the others."""
    recipe = write_toy_recipe(tmp, name, steps=3, n=4, tasks=2, max_tokens=4, concurrency=8)
    script = tmp / f"{name}.jsonl"
    script.write_text("".join(json.dumps({"rollout_id": f"s{s:04d}.numbers-{t}.agentloop.{i}", "text": str((s + t + i) % 3),
                                          "delay_s": 0.3 + 0.8 * i}) + "\n"
                              for s in (1, 2, 3) for t in (0, 1) for i in range(4)))
    recipe.write_text(recipe.read_text().replace("[run]\n", "[run]\nmax_staleness = 1\n")
                      + f'\n[engine]\nname = "scripted"\nscript = "{script}"\n')
    return recipe


@pytest.mark.slow
def test_killed_while_a_step_trains_and_the_next_collects_the_resumed_run_ends_where_an_uninterrupted_one_does(
        tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from test_run_resume import clawgym_run, kill_when, lines

    (tmp_path / "whole").mkdir()
    whole = _scripted_async(tmp_path / "whole", "whole")
    proc = clawgym_run(whole)
    assert proc.wait(timeout=900) == 0, proc.stderr.read().decode()[-2000:]

    (tmp_path / "killed").mkdir()
    recipe = _scripted_async(tmp_path / "killed", "killed")
    run_dir = tmp_path / "killed" / "runs" / "killed"
    s1, s2 = run_dir / "step-0001", run_dir / "step-0002"
    # step 1 trains (its trees are written) while step 2 collects: some of its rollouts done, not all
    proc = clawgym_run(recipe)
    assert kill_when(proc, lambda: (s1 / "trees.parquet").exists() and lines(s2 / "results.jsonl") >= 2)
    assert not (s2 / "rollouts.parquet").exists() and lines(s2 / "results.jsonl") < 8
    kept = {r["rollout_id"]: r for r in A.read_jsonl(s2 / "results.jsonl").records}
    final = clawgym_run(recipe, "--resume")
    _, err = final.communicate(timeout=900)
    assert final.returncode == 0, err.decode()[-2000:]

    for step in (1, 2, 3):
        sdir = run_dir / f"step-{step:04d}"
        planned = {f"s{step:04d}.numbers-{t}.agentloop.{i}" for t in (0, 1) for i in range(4)}
        results = [r["rollout_id"] for r in A.read_jsonl(sdir / "results.jsonl").records]
        assert sorted(results) == sorted(planned)  # none lost, none run twice
        calls = A.read_table(sdir / "calls.parquet", A.CallRecord)
        assert {c.rollout_id for c in calls} == planned and len(calls) == len(planned)
    again = {r["rollout_id"]: r for r in A.read_jsonl(s2 / "results.jsonl").records}
    assert all(again[rid] == row for rid, row in kept.items())  # the rollouts finished before the kill were kept
    a = load_file(tmp_path / "whole" / "runs" / "whole" / "checkpoints" / "step-0003" / "model.safetensors")
    b = load_file(run_dir / "checkpoints" / "step-0003" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
