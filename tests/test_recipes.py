"""Recipes: the shipped ones load; a wrong key, section or type is one error naming file, section and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawgym.run.recipe import load_recipe, recipe_to_toml
from clawgym.run.checks import check_runnable
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


def test_the_cold_start_trains_with_the_memory_settings_of_train_but_its_own_rate(tmp_path: Path) -> None:
    """Teacher demonstrations are as long as the rollouts, so [train]'s activation checkpointing and
    head chunks hold for the cold start too; the optimizer's settings stay [sft]'s."""
    r = load_recipe(_recipe(tmp_path, "[train]\nlr = 0.01\nminibatches = 2\nactivation_checkpointing = false\nhead_chunk = 64\n"
                                      "token_budget = 4096\n\n[sft]\ndemonstrations = 1\nfamily = \"lookup\"\nlr = 0.5\nminibatches = 3\n"))
    sft, step = r.sft_train_config(tmp_path / "m"), r.train_config(1, tmp_path / "m")
    assert (sft.algo, sft.lr, sft.minibatches, step.lr, step.minibatches) == ("sft", 0.5, 3, 0.01, 2)
    for cfg in (sft, step):
        assert (cfg.activation_checkpointing, cfg.head_chunk, cfg.token_budget) == (False, 64, 4096)  # not the defaults


def test_harness_options_and_engine_options_are_kept(tmp_path: Path) -> None:
    r = load_recipe(_recipe(tmp_path, '[rollout.agentloop]\nmax_tokens = 8\n\n[engine]\nname = "scripted"\nscript = "s.jsonl"\n'))
    assert r.rollout.harness_options == {"agentloop": {"max_tokens": 8}}
    assert r.engine.name == "scripted" and r.engine.options == {"script": "s.jsonl"}


def test_ray_section_reaches_the_rollout_config(tmp_path: Path) -> None:
    r = load_recipe(_recipe(tmp_path, '[ray]\naddress = "local"\nnum_cpus = 0.5\nproxy_host = "0.0.0.0"\n'))
    cfg = r.rollout_config(tmp_path / "out", 1, 0)
    assert (cfg.ray, cfg.ray_num_cpus, cfg.proxy_host) == ("local", 0.5, "0.0.0.0")
    assert '[ray]\naddress = "local"\nnum_cpus = 0.5' in recipe_to_toml(r)


HARNESS_RECIPES = {"claude-code": ["claude-code"], "codex": ["codex"], "openclaw": ["openclaw"], "whitebox": ["agentloop"],
                   "mix-harness-smollm2": ["claude-code", "codex", "agentloop"]}
SMALLER_BUDGET = {"openclaw": (32, 5)}
"""(SFT trajectories, RL steps) of a run sized down to fit the hour on 2 cores: every OpenClaw process
spends seconds of CPU starting, so its run starts fewer of them"""


@pytest.mark.parametrize("name", sorted(HARNESS_RECIPES))
def test_the_harness_recipes_train_smollm2_on_lookup_with_one_budget(name: str) -> None:
    """The runs of the harness table (recipes/harness-table.sh) differ only in their harnesses:
    the same model, family, held-out set, teacher-trajectory count, rollouts per step and steps
    (OpenClaw's run fewer of the last two: SMALLER_BUDGET), and each harness slimmed so its prompts
    fit SmolLM2's 8,192-token window."""
    r = load_recipe(ROOT / "recipes" / f"{name}.toml")
    check_runnable(r)
    assert recipe_to_toml(r) == recipe_to_toml(load_recipe(ROOT / "recipes" / f"{name}.toml"))
    lookup = ROOT / "recipes" / "tasks" / "lookup"
    harnesses = HARNESS_RECIPES[name]
    assert (r.model.init, r.engine.chat_template, r.sft.family) == ("smollm2-135m-instruct", "smollm2-tools", "lookup")
    assert r.rollout.harnesses == harnesses and r.sft.harnesses in ([], harnesses)  # the teacher runs in the training harnesses
    assert r.rollout.tasks == lookup / "train" and r.eval.tasks == lookup / "heldout" and r.eval.harnesses == harnesses
    teacher_tasks = r.sft.tasks_per_step or len(list((r.sft.tasks or r.rollout.tasks).iterdir()))
    trajectories, steps = SMALLER_BUDGET.get(name, (96, 10))
    assert r.sft.demonstrations * teacher_tasks * len(harnesses) == trajectories  # SFT trajectories
    assert r.rollout.tasks_per_step * len(harnesses) * r.rollout.group_size == 24  # rollouts a GRPO step
    assert (r.sft.epochs, r.sft.minibatches, r.sft.lr) == (1, 4, 1e-4)  # the short cold start: 4 updates
    assert (r.run.steps, r.eval.every, r.eval.samples_per_task, r.train["lr"]) == (steps, 5, 1, 2e-5)
    options = r.rollout.harness_options
    assert set(options) == set(harnesses) and all(o["max_tokens"] == 48 for o in options.values())
    if "claude-code" in harnesses:  # the one-line system prompt (bare, its default) and four tools
        assert options["claude-code"]["bare"] is True and options["claude-code"]["tools"] == "Bash,Read,Write,Edit"
    if "codex" in harnesses:  # a one-line instructions file and the shell tools
        assert options["codex"]["context_window"] == 8192 and options["codex"]["slim"] is True
    if "openclaw" in harnesses:  # no skills list, workspace files or memory plugin; exec, read, write, edit
        assert options["openclaw"]["slim"] is True and "tools" not in options["openclaw"]


def test_sft_tasks_per_step_draws_the_teacher_tasks_once(tmp_path: Path) -> None:
    """[sft] tasks_per_step: the cold start's teacher shows that many of the tasks, the same draw every time."""
    from clawgym.rollout.runner import select_tasks

    r = load_recipe(ROOT / "recipes" / "mix-harness-smollm2.toml")
    cfg = r.sft_rollout_config(tmp_path / "m")
    assert cfg.tasks_per_step == 32 and cfg.tasks == ROOT / "recipes" / "tasks" / "lookup" / "train"
    picked = [t.id for t in select_tasks(cfg)]
    assert len(picked) == len(set(picked)) == 32 and picked == [t.id for t in select_tasks(cfg)]
    assert r.eval_config(tmp_path / "e", 0, "eval.").tasks_per_step == 0  # evaluations run every held-out task


def test_the_harness_table_script_evaluates_every_run_with_the_recipes_settings(tmp_path: Path) -> None:
    """recipes/harness-table.sh (DRY_RUN=1 prints its `clawgym compare` command): a row for the base
    policy, each run's SFT and last step checkpoints, and the recipes' own harness settings and bound on calls."""
    import subprocess

    from clawgym.rollout.config import harness_options

    for run in HARNESS_RECIPES:
        for ckpt in ("sft", "step-0002", "step-0003"):
            (tmp_path / run / "checkpoints" / ckpt).mkdir(parents=True)
    script = ROOT / "recipes" / "harness-table.sh"
    r = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "RUNS_DIR": str(tmp_path)},
                       capture_output=True, text=True, check=True)
    words = r.stdout.splitlines()
    assert words[:2] == ["clawgym", "compare"]
    flags = {}
    for flag, value in zip(words[2::2], words[3::2]):
        flags.setdefault(flag, []).append(value)
    runs = ["whitebox", "claude-code", "codex", "mix-harness-smollm2"]
    assert flags["--policy"] == [f"base={tmp_path}/whitebox/model-init"] + [
        p for run in runs for p in (f"{run}-sft={tmp_path}/{run}/checkpoints/sft", f"{run}={tmp_path}/{run}/checkpoints/step-0003")]
    assert flags["--harness"] == ["agentloop,claude-code,codex"] and flags["--tasks"] == [str(ROOT / "recipes" / "tasks" / "lookup" / "heldout")]
    options = harness_options(flags["--harness-option"], "--harness-option")  # each harness as its recipes set it
    assert set(options) == {h for hs in HARNESS_RECIPES.values() for h in hs}
    bounds = set()
    for run in HARNESS_RECIPES:
        r = load_recipe(ROOT / "recipes" / f"{run}.toml")
        assert all(options[h] == o for h, o in r.rollout.harness_options.items()), run
        assert (flags["--engine"], flags["--chat-template"]) == ([r.engine.name], [r.engine.chat_template])
        bounds |= {r.rollout.max_calls} - {0}
    assert flags["--max-calls"] == [str(b) for b in bounds]  # the recipes' one bound on a rollout's calls
    r = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "RUNS_DIR": str(tmp_path),
                                                   "BASE": "0", "SFT": "0", "RUNS": "codex mix-harness-smollm2"},
                       capture_output=True, text=True, check=True)
    words = r.stdout.splitlines()
    assert [v for f, v in zip(words[2::2], words[3::2]) if f == "--policy"] == [
        f"{run}={tmp_path}/{run}/checkpoints/step-0003" for run in ("codex", "mix-harness-smollm2")]  # no base row
    (tmp_path / "codex" / "checkpoints" / "step-0002").rmdir()
    (tmp_path / "codex" / "checkpoints" / "step-0003").rmdir()
    r = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "RUNS_DIR": str(tmp_path)},
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.strip() == (f"error: {tmp_path}/codex has no step checkpoint: run `clawgym run "
                                                      "recipes/codex.toml` first, or leave codex out of RUNS")


@pytest.mark.parametrize("recipe", sorted(p.name for p in (Path(__file__).resolve().parents[1] / "recipes").glob("*.toml")))
def test_every_shipped_recipe_takes_the_documented_timeout_override(recipe: str) -> None:
    path = Path(__file__).resolve().parents[1] / "recipes" / recipe
    assert "\ntimeout = " not in path.read_text()  # the recipes use the documented names
    if "\n[offline]" in path.read_text():
        pytest.skip("it replays a run that must exist first (recipes/toy.toml's)")
    assert load_recipe(path, ["rollout.timeout_s=30"]).rollout.timeout_s == 30


def test_an_override_of_a_renamed_key_wins_over_the_old_name_in_the_file(tmp_path: Path) -> None:
    path = _recipe(tmp_path, "timeout = 900\n")
    assert load_recipe(path).rollout.timeout_s == 900  # the old name still loads
    assert load_recipe(path, ["rollout.timeout_s=30"]).rollout.timeout_s == 30
    assert load_recipe(path, ["rollout.timeout=45"]).rollout.timeout_s == 45  # and the old name overrides too
