"""One step of `clawgym run`, by stage: collect, reconstruct, optimize, sync, report, evaluate.

`run_step` runs a step's stages in order (the synchronous loop); the asynchronous loop
(`overlap.py`) runs the same stages, with the collection of later steps in a thread of its own.
Each stage is skipped when its output is already complete, so a resumed run continues where it stopped.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rich.console import Console

from clawgym import peak_memory
from clawgym.errors import UserError
from clawgym.layout import RunLayout, StepLayout
from clawgym.rollout.runner import run_rollouts
from clawgym.run import metrics as M, progress as P
from clawgym.run.eval import evaluate
from clawgym.run.recipe import Recipe
from clawgym.train.loop import train
from clawgym.trees import resolve_config, run_build_trees


def run_step(recipe: Recipe, run: RunLayout, step: int, policy: Path, proxy, stages: Console, progress: P.StepProgress,
             *, trained: bool, report: bool, overlap=None) -> dict[str, float] | None:
    """One step: the stages not yet done, then its metrics line's values (None: already reported).
    With `overlap` (an asynchronous run, overlap.py) the step's rollouts are collected in its thread,
    maybe while the step before trains, and the step hands it each checkpoint once it is served."""
    sdir = run.step(step)
    t0, times = time.monotonic(), {}

    def phase(which: M.Phase, work) -> None:
        progress.phase(step, which.doing)
        t = time.monotonic()
        peak_memory.reset()
        work()
        times[which.key] = time.monotonic() - t
        times[which.peak_key] = peak_memory.peak_gib()
        peak_memory.release()  # what the phase freed leaves the process before the next one

    train_values: dict[str, float] | None = None  # None: trained before a resume, its train/ figures are in train.jsonl
    engine_values: dict[str, float] = {}
    if not trained:
        stages.rule(f"step {step}/{recipe.run.steps}")
        if overlap is None:
            counts = engine_counts(proxy)
            phase(M.COLLECT, lambda: collect(recipe, sdir, step, proxy, stages))
            engine_values = M.engine_values(counts, engine_counts(proxy))
        else:
            progress.phase(step, "waiting for its rollouts")
            times[M.COLLECT.key], engine_values = overlap.wait(step)
        phase(M.RECONSTRUCT, lambda: reconstruct(recipe, sdir, stages))
        if proxy is not None and overlap is None:  # its keys/values cannot serve the weights training writes
            proxy.admin("DELETE", "/admin/engine/cache")
        train_values = {}
        phase(M.OPTIMIZE, lambda: train_values.update(train_step(recipe, policy, step, stages)))
        if proxy is not None:
            phase(M.SYNC, lambda: proxy.admin("POST", "/admin/reload", {"checkpoint": str(sdir.checkpoint)}, timeout=600))
        if overlap is not None:
            overlap.served(step)
    if not report:
        return None
    values = M.step_values(sdir, engine=engine_values, train=train_values, times=times)
    if recipe.run.max_staleness:
        values.update(M.version_values(sdir, step - 1, recipe.run.max_staleness))
    if recipe.eval.every and step % recipe.eval.every == 0 and proxy is not None:
        phase(M.EVALUATE, lambda: values.update(evaluate_step(recipe, run, step, proxy, stages)))
        values[M.EVALUATE.key], values[M.EVALUATE.peak_key] = times[M.EVALUATE.key], times[M.EVALUATE.peak_key]
    values[M.STEP_SECONDS] = time.monotonic() - t0
    return values


def engine_counts(proxy) -> dict[str, float]:
    """The engine's cumulative prompt-token counters (the hf engine's prefix cache); {} when it reports none."""
    if proxy is None:
        return {}
    stats = proxy.admin("GET", "/admin/engine")["stats"]
    return {k: float(stats[k]) for k in M.ENGINE_COUNTERS if k in stats}


def collect(recipe: Recipe, sdir: StepLayout, step: int, proxy, stages: Console, served: int | None = None) -> None:
    """The step's rollouts (or an [offline] run's saved ones), by the policy the proxy serves:
    version `served` (default step - 1, the synchronous loop's)."""
    if recipe.offline.from_run is not None:
        copy_offline(RunLayout(recipe.offline.from_run).step(step), sdir)
    elif not sdir.rollouts.exists():
        # a step none of whose rollouts could be scored stops the run naming why, not a later stage's "no trainable tokens"
        version = step - 1 if served is None else served
        run_rollouts(recipe.rollout_config(sdir.path, step, policy_version=version), stages, proxy=proxy).check_scored()


def reconstruct(recipe: Recipe, sdir: StepLayout, stages: Console) -> None:
    if not sdir.trees.exists():
        cfg = resolve_config(sdir.path, None, None, None, recipe.trees.max_leaves, sdir.trees_metrics, sdir.step)
        run_build_trees(cfg, stages)


def train_step(recipe: Recipe, policy: Path, step: int, stages: Console) -> dict[str, float]:
    """Train step `step` (a complete checkpoint is kept as it is); its train/ metrics, as train() reduces them."""
    # A batch with nothing to learn (every group flat) still writes the unchanged policy, so the
    # loop goes on; a batch with no trainable token at all (every rollout failed) stops the run.
    return train(recipe.train_config(step, policy), stages).metrics


def copy_offline(src: StepLayout, sdir: StepLayout) -> None:
    if not src.trees.exists():
        raise UserError(f"{src.path}: no trees.parquet to retrain on (the run has fewer steps, or they did not finish)")
    sdir.path.mkdir(parents=True, exist_ok=True)
    for name in ("rollouts", "calls", "trees"):
        source, dest = getattr(src, name), getattr(sdir, name)
        if source.exists() and not dest.exists():
            shutil.copy2(source, dest)


def evaluate_step(recipe: Recipe, run: RunLayout, step: int, proxy, console: Console) -> dict[str, float]:
    report = evaluate(recipe.eval_config(run.eval(step).path, step, f"e{step:04d}."), console, proxy=proxy)
    report.print(console)
    return M.eval_values(report.metrics())
