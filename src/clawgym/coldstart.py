"""The SFT cold start of `clawgym run` (a recipe's `[sft]`): teacher trajectories through the real path, then SFT.

Paper §4.5: a lightweight cold start on teacher trajectories before RL. Read top to bottom (`cold_start`):

1. base eval — Pass@1 of the starting policy on the eval tasks → RUN/eval/base/eval.{md,json}
2. teach — rollouts of the teacher (the `[sft] engine`, by default a task family's `teacher`
   engine) through the proxy and the harness, exactly as a real teacher model's: recorded with the
   student's tokenizer → RUN/sft/{rollouts,calls}.parquet
3. reconstruct — build-trees → RUN/sft/trees.parquet
4. optimize — `train --algo sft` on the trees (trajectories scoring ≥ `min_reward`) → RUN/checkpoints/sft
5. sft eval — Pass@1 of the SFT policy → RUN/eval/sft/eval.{md,json}

Each stage is skipped when its output is complete, so `--resume` continues here as in the loop.
The RL steps then start from RUN/checkpoints/sft. `write_table` puts the evaluations side by side,
as the paper's Table 1: rows base, SFT, SFT+RL; columns the task categories.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import orjson
from rich.console import Console

from clawgym import artifacts as A
from clawgym.config import Recipe, sft_engine_options
from clawgym.eval import pass_table
from clawgym.layout import RunLayout


def _eval(recipe: Recipe, run: RunLayout, label: str, policy: Path, console: Console, rollout_config: Callable) -> None:
    from clawgym.eval import evaluate

    out = run.eval(label)
    if out.eval_json.exists():
        return
    console.rule(f"eval: {label} policy")
    cfg = rollout_config(recipe, out.path, 0, 0, tasks=recipe.eval.tasks or recipe.rollout.tasks, n=recipe.eval.n,
                         harnesses=recipe.eval.harnesses or None)
    evaluate(dataclasses.replace(cfg, model=policy, id_prefix=f"e-{label}."), console).print(console)


def cold_start(recipe: Recipe, run: RunLayout, policy: Path, console: Console, rollout_config: Callable) -> Path:
    """Run the stages above (each only if not yet done); returns the SFT checkpoint.

    `rollout_config` is the loop's (recipe, out, step, policy_version, tasks=, n=, harnesses=) -> RolloutConfig.
    """
    sft = recipe.sft
    sdir = run.sft
    ckpt = sdir.checkpoint
    evals = recipe.eval.every > 0
    if evals:
        _eval(recipe, run, "base", policy, console, rollout_config)
    if not sdir.rollouts.exists():
        from clawgym.rollout.runner import run_rollouts

        console.rule(f"sft: {sft.n} teacher trajectories per task ({sft.engine})")
        cfg = rollout_config(recipe, sdir.path, 0, 0, tasks=sft.tasks or recipe.rollout.tasks, n=sft.n,
                             harnesses=sft.harnesses or None)
        run_rollouts(dataclasses.replace(cfg, model=policy, engine=sft.engine, engine_options=sft_engine_options(recipe),
                                         id_prefix="sft."), console)
    if not sdir.trees.exists():
        from clawgym.trees import resolve_config, run_build_trees

        run_build_trees(resolve_config(sdir.path, None, None, None, recipe.trees.max_leaves, sdir.trees_metrics, 0), console)
    from clawgym.train.loop import TrainConfig, train

    shared = {k: v for k, v in recipe.train.items() if k in ("token_budget", "attention", "max_grad_norm", "aggregation")}
    train(TrainConfig(trees=sdir.trees, rollouts=sdir.rollouts, model=policy, out=ckpt,
                      metrics=sdir.train_metrics, resume=True, algo="sft", lr=sft.lr, epochs=sft.epochs,
                      minibatches=sft.minibatches, min_reward=sft.min_reward, seed=recipe.run.seed, **shared), console)
    # (train with resume=True keeps a complete checkpoint as it is)
    if evals:
        _eval(recipe, run, "sft", ckpt, console, rollout_config)
    return ckpt


def sft_values(run: RunLayout) -> dict[str, float]:
    """The cold start's numbers for the step-0 metrics line: teacher reward, SFT loss, base and SFT Pass@1."""
    values: dict[str, float] = {}
    sdir = run.sft
    rollouts = A.read_table(sdir.rollouts, A.RolloutRecord)
    scored = [r.reward for r in rollouts if r.reward is not None]
    values["rollout/teacher_n"] = len(rollouts)
    values["rollout/teacher_reward_mean"] = sum(scored) / len(scored) if scored else 0.0
    lines = A.read_jsonl(sdir.train_metrics).records if sdir.train_metrics.exists() else []
    losses = [r["train/loss"] for r in lines if "train/loss" in r]
    if losses:
        values["train/sft_loss_first"], values["train/sft_loss_last"] = losses[0], losses[-1]
    for label, prefix in (("base", "eval/base/"), ("sft", "eval/")):
        path = run.eval(label).eval_json
        if path.exists():
            doc = orjson.loads(path.read_bytes())
            values[f"{prefix}pass@1"] = doc["pass@1"]
            values.update({f"{prefix}pass@1/{c}": v for c, v in doc["per_category"].items()})
    return values


def write_table(run: RunLayout, console: Console) -> Path | None:
    """RUN/table.md (and table.json): Pass@1 by category for base, SFT and the last SFT+RL eval."""
    rows: dict[str, dict] = {}
    for label, name in (("base", "base"), ("SFT", "sft")):
        path = run.eval(name).eval_json
        if path.exists():
            rows[label] = orjson.loads(path.read_bytes())
    steps = [e for _, e in run.evals() if e.eval_json.exists()]
    if steps:
        rows[f"SFT+RL ({steps[-1].path.name})"] = orjson.loads(steps[-1].eval_json.read_bytes())
    if not rows:
        return None
    text = pass_table(rows)
    A.atomic_write_bytes(run.table_md, text.encode())
    A.atomic_write_bytes(run.table_json, orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    console.print(text, highlight=False)
    return run.table_md
