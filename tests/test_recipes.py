"""Recipes: the shipped ones load; a wrong key, section or type is one error naming file, section and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym.config import load_recipe, recipe_to_toml
from clawgym.recipe_checks import check_runnable
from clawgym.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["toy", "grpo-claude-code", "ppo-openclaw", "mix-harness"])
def test_shipped_recipes_load(name: str) -> None:
    r = load_recipe(ROOT / "recipes" / f"{name}.toml")
    assert r.run.name == name and r.rollout.tasks == ROOT / "recipes" / "tasks" / "toy"
    assert r.run_dir == ROOT / "recipes" / "runs" / name
    assert recipe_to_toml(r) == recipe_to_toml(load_recipe(ROOT / "recipes" / f"{name}.toml"))


def test_offline_recipe_names_the_missing_run(tmp_path: Path) -> None:
    recipe = tmp_path / "offline.toml"
    recipe.write_text((ROOT / "recipes" / "offline-retrain.toml").read_text())
    with pytest.raises(UserError, match=r"\[offline\] key 'from_run': .*runs/toy is not a run directory"):
        load_recipe(recipe)


def _recipe(tmp_path: Path, body: str) -> Path:
    (tmp_path / "tasks").mkdir(exist_ok=True)
    path = tmp_path / "r.toml"
    path.write_text('[model]\ninit = "tiny"\n\n[rollout]\ntasks = "tasks"\n' + body)
    return path


@pytest.mark.parametrize("body,message", [
    ("[train]\nlrr = 0.1\n", r"\[train\]: unknown key 'lrr' \(did you mean 'lr'\?\); known: "),
    ("[train]\nlr = 'fast'\n", r"\[train\] key 'lr' must be float, got str"),
    ("[train]\nout = 'x'\n", r"\[train\]: unknown key 'out'"),
    ("[trees]\nmax_leaves = true\n", r"\[trees\] key 'max_leaves' must be int, got bool"),
    ("[run]\nsteps = 0\n", r"\[run\] key 'steps' must be at least 1"),
    ("[rollot]\nn = 1\n", r"unknown section \[rollot\]"),
    ("[eval]\nharnesses = ['nope']\n", r"unknown harness 'nope'"),
    ("[train]\nlora_rank = 8.5\n", r"\[train\] key 'lora_rank' must be int, got float"),
])
def test_recipe_errors_name_the_key(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_recipe(_recipe(tmp_path, body))


@pytest.mark.parametrize("body,message", [
    ("[train]\nalgo = 'grpp'\n", r"\[train\] key 'algo': unknown 'grpp' \(did you mean 'grpo'\?\); choose one of: grpo, ppo, sft"),
    # what `train` itself refuses (TrainConfig.validate, torch-free), refused before `clawgym run` writes
    ("[train]\nlora_rank = 4\nlora_alpha = 0\n", r"\[train\]: --lora-alpha must be positive, got 0"),
    ("[train]\nhead_chunk = -1\n", r"\[train\]: --head-chunk must be 0 \(no chunks\) or more, got -1"),
    ("[train]\nfsdp = true\n", r"\[train\]: --fsdp shards across ranks"),
])
def test_train_settings_train_would_refuse_are_refused_before_the_run(tmp_path: Path, body: str, message: str) -> None:
    r = load_recipe(_recipe(tmp_path, body))
    with pytest.raises(UserError, match=message):
        check_runnable(r)


def test_model_and_tasks_are_required(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text("[run]\nsteps = 1\n")
    with pytest.raises(UserError, match=r"\[model\]: give exactly one of 'path'"):
        load_recipe(path)
    path.write_text('[model]\ninit = "tiny"\n')
    with pytest.raises(UserError, match=r"\[rollout\]: 'tasks'"):
        load_recipe(path)
    with pytest.raises(UserError, match="no such recipe file"):
        load_recipe(tmp_path / "missing.toml")
    path.write_text("[run\n")
    with pytest.raises(UserError, match="not valid TOML"):
        load_recipe(path)


def test_lora_keys_reach_the_train_config(tmp_path: Path) -> None:
    r = load_recipe(_recipe(tmp_path, '[train]\nlora_rank = 8\nlora_alpha = 16\nlora_targets = "q_proj,v_proj"\n'))
    assert r.train == {"lora_rank": 8, "lora_alpha": 16.0, "lora_targets": "q_proj,v_proj"}


def test_harness_options_and_engine_options_are_kept(tmp_path: Path) -> None:
    r = load_recipe(_recipe(tmp_path, '[rollout.agentloop]\nmax_tokens = 8\n\n[engine]\nname = "scripted"\nscript = "s.jsonl"\n'))
    assert r.rollout.harness_options == {"agentloop": {"max_tokens": 8}}
    assert r.engine.name == "scripted" and r.engine.options == {"script": "s.jsonl"}


def test_ray_section_reaches_the_rollout_config(tmp_path: Path) -> None:
    r = load_recipe(_recipe(tmp_path, '[ray]\naddress = "local"\nnum_cpus = 0.5\nproxy_host = "0.0.0.0"\n'))
    cfg = r.rollout_config(tmp_path / "out", 1, 0)
    assert (cfg.ray, cfg.ray_num_cpus, cfg.proxy_host) == ("local", 0.5, "0.0.0.0")
    assert '[ray]\naddress = "local"\nnum_cpus = 0.5' in recipe_to_toml(r)
