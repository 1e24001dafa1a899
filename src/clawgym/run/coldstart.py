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

import contextlib
import time
from pathlib import Path

import orjson
from rich.console import Console

from clawgym import artifacts as A, peak_memory
from clawgym.layout import RunLayout
from clawgym.rollout.runner import run_rollouts
from clawgym.run import metrics as M
from clawgym.run.eval import evaluate, pass_table
from clawgym.run.recipe import Recipe
from clawgym.train.checkpoint import is_complete
from clawgym.train.loop import train
from clawgym.trees import resolve_config, run_build_trees


def _eval(recipe: Recipe, run: RunLayout, label: str, policy: Path, console: Console) -> None:
    out = run.eval(label)
    if out.eval_json.exists():
        return
    console.rule(f"eval: {label} policy")
    evaluate(recipe.eval_config(out.path, 0, f"e-{label}.", model=policy), console).print(console)


def cold_start(recipe: Recipe, run: RunLayout, policy: Path, console: Console) -> Path:
    """Run the stages above (each only if not yet done); returns the SFT checkpoint. The step-0
    metrics line of what it did is `metrics.cold_start_values`."""
    sft = recipe.sft
    sdir = run.sft
    evals = recipe.eval.every > 0
    base_eval, teach, optimize, sft_eval = M.COLD_START_PHASES
    if evals:
        with _timed(run, base_eval, not run.eval("base").eval_json.exists()):
            _eval(recipe, run, "base", policy, console)
    if not sdir.rollouts.exists():
        console.rule(f"sft: {sft.demonstrations} teacher trajectories per task ({sft.engine})")
        with _timed(run, teach):
            run_rollouts(recipe.sft_rollout_config(policy), console).check_scored()

    cfg = recipe.sft_train_config(policy)
    with _timed(run, optimize, not is_complete(cfg.out)):
        if not sdir.trees.exists():
            run_build_trees(resolve_config(sdir.path, None, None, None, recipe.trees.max_leaves, sdir.trees_metrics, 0), console)
        train(cfg, console)  # (with resume=True a complete checkpoint is kept as it is)
    if evals:
        with _timed(run, sft_eval, not run.eval("sft").eval_json.exists()):
            _eval(recipe, run, "sft", cfg.out, console)
    return cfg.out


@contextlib.contextmanager
def _timed(run: RunLayout, stage: M.Phase, works: bool = True):
    """Adds the block's wall seconds under the stage's key to RUN/sft/seconds.json, and its peak
    resident memory under its peak key, if it `works` (a stage that a resume skips keeps the figures
    of the run that did it)."""
    t0 = time.perf_counter()
    peak_memory.reset()
    try:
        yield
    finally:
        peak_memory.release()  # what the stage freed leaves the process before the next one
    if not works:
        return
    path = run.cold_start_seconds
    seconds = orjson.loads(path.read_bytes()) if path.exists() else {}
    seconds[stage.key] = seconds.get(stage.key, 0.0) + time.perf_counter() - t0
    seconds[stage.peak_key] = max(seconds.get(stage.peak_key, 0.0), peak_memory.peak_gib())
    path.parent.mkdir(parents=True, exist_ok=True)
    A.atomic_write_bytes(path, orjson.dumps(seconds))


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
