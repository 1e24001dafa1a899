"""`clawgym run RECIPE.toml`: the whole RL loop, step after step, resumable (paper §3, Figure 1).

One step, read top to bottom (`run`):

1. collect — rollouts through the proxy serving the current policy → step-NNNN/{rollouts,calls}.parquet
2. reconstruct — build-trees → step-NNNN/trees.parquet
3. optimize — train on the trees → checkpoints/step-NNNN (HF format + trainer state)
4. sync — the proxy's engine reloads the new weights (policy_version = NNNN)
5. report — one metrics.jsonl line (rollout/ trees/ train/ eval/ time/), plots/*.png
6. evaluate — every `[eval] every` steps: Pass@1 of the current policy on the eval tasks

Every stage writes atomically and is skipped when its output is already complete, so `--resume`
after a kill at any moment continues from the last complete stage: the collect stage itself keeps
finished rollouts (results.jsonl) and reruns unfinished ones, so no rollout is lost or duplicated.
An `[offline] from_run` recipe skips collecting and trains on that run's saved trees.
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import time
from pathlib import Path

from rich.console import Console

from clawgym import artifacts as A
from clawgym.config import Recipe, load_recipe, recipe_to_toml
from clawgym.errors import UserError


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:04d}"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:04d}"


def _complete_checkpoint(path: Path) -> bool:
    from clawgym.train.checkpoint import load_state

    state = load_state(path) if path.is_dir() else None
    return state is not None and state.complete


def _initial_policy(recipe: Recipe, run_dir: Path) -> Path:
    if recipe.model.path is not None:
        return recipe.model.path
    path = run_dir / "model-init"
    if not (path / "config.json").exists():
        from clawgym.model import init_model

        init_model(path, seed=recipe.model.init_seed, size=recipe.model.init, force=True)
    return path


def _prepare(recipe: Recipe, resume: bool) -> Path:
    run_dir = recipe.run_dir
    saved = run_dir / "recipe.toml"
    text = recipe_to_toml(recipe)
    if saved.exists() and not resume:
        raise UserError(f"{run_dir} already holds a run; pass --resume to continue it, or choose another [run] name")
    if saved.exists() and saved.read_text() != text:
        raise UserError(f"{saved} differs from {recipe.path}: a run resumes with the recipe it started with")
    run_dir.mkdir(parents=True, exist_ok=True)
    A.atomic_write_bytes(saved, text.encode())
    return run_dir


def run(recipe_path: str | Path, *, resume: bool = False, console: Console | None = None) -> list[A.MetricsLine]:
    console = console or Console(stderr=True)
    recipe = load_recipe(recipe_path)
    run_dir = _prepare(recipe, resume)
    metrics_path = run_dir / "metrics.jsonl"
    reported = {m.step for m in A.read_metrics(metrics_path)} if metrics_path.exists() else set()
    policy = _initial_policy(recipe, run_dir)
    if recipe.sft.n and recipe.offline.from_run is None:  # the SFT cold start (coldstart.py), then RL from it
        from clawgym.coldstart import cold_start, sft_values

        policy = cold_start(recipe, run_dir, policy, console, rollout_config)
        if 0 not in reported:
            A.append_metrics(metrics_path, A.MetricsLine(0, sft_values(run_dir), time=time.time()))
            reported.add(0)
    first = 1
    while first <= recipe.run.steps and _complete_checkpoint(checkpoint_dir(run_dir, first)):
        policy, first = checkpoint_dir(run_dir, first), first + 1

    with _proxy(recipe, run_dir, policy, version=first - 1) as proxy:
        for step in range(1, recipe.run.steps + 1):
            sdir, ckpt = step_dir(run_dir, step), checkpoint_dir(run_dir, step)
            t0, times = time.monotonic(), {}
            if step >= first:
                console.rule(f"step {step}/{recipe.run.steps}")
                # 1. collect
                if recipe.offline.from_run is not None:
                    _copy_offline(recipe.offline.from_run, sdir, step)
                elif not (sdir / "rollouts.parquet").exists():
                    from clawgym.rollout.runner import run_rollouts

                    run_rollouts(rollout_config(recipe, sdir, step, policy_version=step - 1), console, proxy=proxy)
                times["time/collect_s"] = time.monotonic() - t0
                # 2. reconstruct
                t = time.monotonic()
                if not (sdir / "trees.parquet").exists():
                    from clawgym.trees import resolve_config, run_build_trees

                    cfg = resolve_config(sdir, None, None, None, recipe.trees.max_leaves, sdir / "trees.metrics.jsonl", step)
                    run_build_trees(cfg, console)
                times["time/reconstruct_s"] = time.monotonic() - t
                # 3. optimize
                t = time.monotonic()
                _train_step(recipe, sdir, policy, ckpt, step)
                times["time/optimize_s"] = time.monotonic() - t
                # 4. sync
                t = time.monotonic()
                if proxy is not None:
                    proxy.admin("POST", "/admin/reload", {"checkpoint": str(ckpt)}, timeout=600)
                times["time/sync_s"] = time.monotonic() - t
            policy = ckpt
            # 5. report (once per step, also after a resume that found the step already trained)
            if step not in reported:
                values = {**step_values(sdir), **times, "time/step_s": time.monotonic() - t0}
                # 6. evaluate
                if recipe.eval.every and step % recipe.eval.every == 0 and proxy is not None:
                    values.update(_evaluate(recipe, run_dir, step, proxy, console))
                line = A.MetricsLine(step, values, time=time.time())
                A.append_metrics(metrics_path, line)
                reported.add(step)
                _print_step(console, line)
                from clawgym.plots import write_plots

                write_plots(run_dir)
    if recipe.sft.n and recipe.eval.every:
        from clawgym.coldstart import write_table

        write_table(run_dir, console)
    return A.read_metrics(metrics_path)


def _proxy(recipe: Recipe, run_dir: Path, policy: Path, version: int):
    """One proxy for the whole run, serving `policy`; none for offline retraining."""
    import contextlib

    if recipe.offline.from_run is not None:
        return contextlib.nullcontext(None)
    from clawgym.rollout.proxy_client import start_local_proxy

    cfg = dataclasses.replace(rollout_config(recipe, run_dir, 0, version), model=policy)
    return start_local_proxy(cfg, run_dir)  # records under RUN/records, copied into each step's folder


def rollout_config(recipe: Recipe, out: Path, step: int, policy_version: int, *, tasks: Path | None = None,
                   n: int | None = None, harnesses: list[str] | None = None):
    from clawgym.rollout.runner import RolloutConfig
    from clawgym.rollout.verifier import VerifierConfig

    ro = recipe.rollout
    return RolloutConfig(tasks=tasks or ro.tasks, harnesses=harnesses or ro.harnesses, out=out, n=n or ro.n,
                         concurrency=ro.concurrency, engine=recipe.engine.name, engine_options=dict(recipe.engine.options),
                         chat_template=recipe.engine.chat_template,
                         timeout_s=ro.timeout_s, sandbox=ro.sandbox, network=ro.network, step=step,
                         policy_version=policy_version, harness_options=ro.harness_options, verifier=VerifierConfig.with_judge(ro.judge_url, ro.judge_model),
                         ray=recipe.ray.address, ray_num_cpus=recipe.ray.num_cpus, proxy_host=recipe.ray.proxy_host,
                         tool_parser=recipe.engine.tool_parser)


def _train_step(recipe: Recipe, sdir: Path, policy: Path, ckpt: Path, step: int) -> None:
    from clawgym.train.loop import TrainConfig, train

    if _complete_checkpoint(ckpt):
        return
    kwargs = {"seed": recipe.run.seed + step, **recipe.train}
    # A batch with nothing to learn (every group flat) still writes the unchanged policy, so the
    # loop goes on; a batch with no trainable token at all (every rollout failed) stops the run.
    train(TrainConfig(trees=sdir / "trees.parquet", rollouts=sdir / "rollouts.parquet", model=policy, out=ckpt,
                      metrics=sdir / "train.jsonl", resume=True, **kwargs))


def _copy_offline(from_run: Path, sdir: Path, step: int) -> None:
    src = step_dir(from_run, step)
    if not (src / "trees.parquet").exists():
        raise UserError(f"{src}: no trees.parquet to retrain on (the run has fewer steps, or they did not finish)")
    sdir.mkdir(parents=True, exist_ok=True)
    for name in ("rollouts.parquet", "calls.parquet", "trees.parquet"):
        if (src / name).exists() and not (sdir / name).exists():
            shutil.copy2(src / name, sdir / name)


def step_values(sdir: Path) -> dict[str, float]:
    """rollout/ trees/ train/ numbers of a finished step, from its files (also `clawgym inspect` of a
    run whose stages were chained from the shell, which has no metrics.jsonl lines of its own)."""
    values: dict[str, float] = {}
    rollouts = A.read_table(sdir / "rollouts.parquet", A.RolloutRecord)
    scored = [r.reward for r in rollouts if r.reward is not None]
    values["rollout/n"] = len(rollouts)
    values["rollout/reward_mean"] = statistics.fmean(scored) if scored else 0.0
    values["rollout/infra_error"] = sum(r.status == "infra_error" for r in rollouts)
    values["rollout/timeout"] = sum(r.status == "timeout" for r in rollouts)
    for h in sorted({r.harness for r in rollouts}):
        hs = [r.reward for r in rollouts if r.harness == h and r.reward is not None]
        values[f"rollout/reward_mean/{h}"] = statistics.fmean(hs) if hs else 0.0
    for path in (sdir / "trees.metrics.jsonl",):
        if path.exists():
            for m in A.read_metrics(path)[-1:]:
                values.update(m.values)
    train_path = sdir / "train.jsonl"
    if train_path.exists():
        lines = A.read_jsonl(train_path).records
        for key in sorted({k for r in lines for k in r}):
            nums = [r[key] for r in lines if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
            if nums and key not in ("step", "update", "time"):
                name = key if key.startswith("train/") else f"train/{key}"
                values[name] = nums[-1] if "tokens" in key or "count" in key else statistics.fmean(nums)
    return values


def _evaluate(recipe: Recipe, run_dir: Path, step: int, proxy, console: Console) -> dict[str, float]:
    from clawgym.eval import evaluate

    tasks = recipe.eval.tasks or recipe.rollout.tasks
    cfg = rollout_config(recipe, run_dir / "eval" / f"step-{step:04d}", 0, step, tasks=tasks, n=recipe.eval.n,
                         harnesses=recipe.eval.harnesses or None)
    cfg = dataclasses.replace(cfg, id_prefix=f"e{step:04d}.")
    report = evaluate(cfg, console, proxy=proxy)
    report.print(console)
    return {f"eval/{k}": v for k, v in report.metrics().items()}


def _print_step(console: Console, line: A.MetricsLine) -> None:
    v = line.values
    parts = [f"step {line.step}", f"reward {v.get('rollout/reward_mean', 0):.3f}"]
    for key, label in (("train/loss", "loss"), ("train/entropy", "entropy"), ("trees/tree_token_ratio", "tree/calls"),
                       ("trees/tokens_saved", "tree saved"), ("train/tokens_saved", "packing saved"),
                       ("eval/pass@1", "eval"), ("time/step_s", "s")):
        if key in v:
            parts.append(f"{v[key]:.0f} s" if label == "s" else f"{label} {v[key]:,.0f}" if "saved" in label
                         else f"{label} {v[key]:.3f}")
    console.print("  ".join(parts), highlight=False)
