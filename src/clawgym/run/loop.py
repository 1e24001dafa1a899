"""`clawgym run RECIPE.toml`: the whole RL loop, step after step, resumable (paper §3, Figure 1).

One step, read top to bottom (`run`):

1. collect — rollouts through the proxy serving the current policy → step-NNNN/{rollouts,calls}.parquet
2. reconstruct — build-trees → step-NNNN/trees.parquet
3. optimize — train on the trees → checkpoints/step-NNNN (HF format + trainer state)
4. sync — the proxy's engine reloads the new weights (policy_version = NNNN)
5. report — one metrics.jsonl line (rollout/ trees/ train/ eval/ time/ memory/), plots/*.png
6. evaluate — every `[eval] every` steps: Pass@1 of the current policy on the eval tasks

Every stage writes atomically and is skipped when its output is already complete, so `--resume`
after a kill at any moment continues from the last complete stage: the collect stage itself keeps
finished rollouts (results.jsonl) and reruns unfinished ones, so no rollout is lost or duplicated.
An `[offline] from_run` recipe skips collecting and trains on that run's saved trees. With
`[run] max_staleness` >= 1 the steps' collection runs in a thread of its own, ahead of training by
as many policy versions as the bound allows (overlap.py); each step's stages are in steps.py.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import tomllib
from pathlib import Path

from rich.console import Console

from clawgym import artifacts as A, console as C
from clawgym.errors import UserError
from clawgym.layout import RunLayout
from clawgym.models.pretrained import PRETRAINED, init_pretrained
from clawgym.models.tiny import init_model
from clawgym.rollout.proxy_client import start_local_proxy
from clawgym.rollout.sandbox import announce, isolation
from clawgym.run import metrics as M, progress as P
from clawgym.run.checks import check_runnable
from clawgym.run.coldstart import cold_start, write_table
from clawgym.run.plots import write_plots
from clawgym.run.recipe import Recipe, load_recipe, recipe_to_toml
from clawgym.run.replay import change_line, run_steps, start_policy
from clawgym.run.sinks import close_sinks, open_sinks
from clawgym.run.overlap import overlapped
from clawgym.run.steps import run_step
from clawgym.train.checkpoint import is_complete


def _initial_policy(recipe: Recipe, run: RunLayout) -> Path:
    if recipe.model.path is not None:
        return recipe.model.path
    if recipe.model.init is None:  # an [offline] recipe without [model]: where the replayed run started
        return start_policy(RunLayout(recipe.offline.from_run))
    path = run.model_init
    if not (path / "config.json").exists():
        if recipe.model.init in PRETRAINED:  # converted once per machine, then copied from the cache
            init_pretrained(path, recipe.model.init, force=True)
        else:
            init_model(path, seed=recipe.model.init_seed, size=recipe.model.init, force=True)
    return path


def _prepare(recipe: Recipe, resume: bool, force: bool = False) -> RunLayout:
    """The run directory, checked against the recipe, with the recipe saved in it. `run` calls it
    after every check that can stop a run before any work (check_runnable), so a refused run leaves
    no recipe.toml behind and its rerun is not refused."""
    run = RunLayout(recipe.run_dir)
    text = recipe_to_toml(recipe)
    if force and run.root.exists():
        shutil.rmtree(run.root)  # --force: the run starts anew, as if its folder had never been there
    if resume and not run.recipe.exists():
        raise UserError(f"{run.root}: no run to resume there; drop --resume to start it")
    if run.recipe.exists() and not resume:
        raise UserError(f"{run.root} already holds a run; pass --resume to continue it, --force to start it anew, or choose "
                        f"another [run] name")
    if run.recipe.exists() and run.recipe.read_text() != text and recipe_to_toml(load_recipe(run.recipe)) != text:
        # (the second test reads the saved recipe as this version spells it: renamed keys, new defaults)
        old, new = _flat(tomllib.loads(run.recipe.read_text())), _flat(tomllib.loads(text))
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        raise UserError(f"{run.recipe} differs from {recipe.path} and its overrides ({', '.join(keys)}): a run resumes "
                        "with the recipe it started with (--force starts it anew)")
    run.root.mkdir(parents=True, exist_ok=True)
    A.atomic_write_bytes(run.recipe, text.encode())
    return run


def _flat(doc: dict, prefix: str = "") -> dict[str, object]:
    """A TOML document's values by dotted key (train.lr, rollout.agentloop.max_tokens)."""
    out: dict[str, object] = {}
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run(recipe_path: str | Path, *, overrides: list[str] | tuple[str, ...] = (), resume: bool = False, force: bool = False,
        console: Console | None = None, verbose: bool = False) -> list[A.MetricsLine]:
    """The loop (module docstring). `overrides` ("train.lr=0.1") set recipe keys over the file's.
    `console` gets one line per step under a progress bar over the steps; with `verbose` every stage
    also prints its own tables there."""
    console = console or C.STDERR
    stages = console if verbose else C.QUIET
    recipe = load_recipe(recipe_path, overrides)
    check_runnable(recipe)  # harness options, [train] values, extras, tasks: before any file is written
    isolated = None
    if recipe.offline.from_run is None:  # before anything is written: a sandbox that cannot isolate files is refused
        isolated = isolation(recipe.rollout.sandbox, recipe.rollout.network)
    run = _prepare(recipe, resume, force)
    if isolated is not None:
        announce(isolated, console)  # once the run is accepted, so a refused resume stays one line
    reported = {m.step for m in A.read_metrics(run.metrics)} if run.metrics.exists() else set()
    # the step after the last trained one (with [run] keep_last, earlier checkpoints may be gone)
    first = 1 + max((s for s in range(1, recipe.run.steps + 1) if is_complete(run.step(s).checkpoint)), default=0)

    sinks = open_sinks(run, tensorboard=recipe.log.tensorboard, wandb=recipe.log.wandb, name=recipe.run.name,
                       first_step=min([first, *(s for s in range(1, first) if s not in reported)]),
                       config=tomllib.loads(run.recipe.read_text()))  # the resolved recipe, plain values

    def report(line: A.MetricsLine) -> None:
        A.append_metrics(run.metrics, line)  # the source of truth first, then the sinks
        for sink in sinks:
            sink.write(line)
        reported.add(line.step)

    try:
        policy = _initial_policy(recipe, run)
        if recipe.offline.from_run is not None and first <= recipe.run.steps:
            console.print(change_line(RunLayout(recipe.offline.from_run), run_steps(RunLayout(recipe.offline.from_run))[:recipe.run.steps],
                                      recipe.train, None if recipe.model.path is None and recipe.model.init is None else policy), highlight=False, soft_wrap=True)
        if recipe.sft.demonstrations and recipe.offline.from_run is None:  # the SFT cold start (coldstart.py), then RL from it
            with console.status("SFT cold start: teacher rollouts, SFT, evaluations") if not verbose else contextlib.nullcontext():
                policy = cold_start(recipe, run, policy, stages)
            if 0 not in reported:
                line = A.MetricsLine(0, M.cold_start_values(run), time=time.time())
                report(line)
                console.print(P.cold_start_line(line.values), highlight=False, soft_wrap=True)
        if first > 1:
            policy = run.step(first - 1).checkpoint
        # [run] max_staleness >= 1: later steps' rollouts are collected in a thread of their own (overlap.py)
        with _proxy(recipe, run, policy, version=first - 1) as proxy, \
                P.StepProgress(console, recipe.run.steps, done=first - 1) as progress, \
                overlapped(recipe, run, first, proxy, stages) as overlap:
            for step in range(1, recipe.run.steps + 1):
                values = run_step(recipe, run, step, policy, proxy, stages, progress, trained=step < first,
                                  report=step not in reported, overlap=overlap)
                policy = run.step(step).checkpoint
                if values is not None:
                    line = A.MetricsLine(step, values, time=time.time())
                    report(line)
                    progress.finished(step, values, None if step < first else values[M.STEP_SECONDS])
                    if recipe.run.keep_last:
                        prune_checkpoints(run, step, recipe.run.keep_last)
                    write_plots(run.root)
    finally:
        close_sinks(sinks)
    if recipe.sft.demonstrations and recipe.eval.every:
        write_table(run, console)
    return A.read_metrics(run.metrics)


def prune_checkpoints(run: RunLayout, step: int, keep_last: int) -> list[int]:
    """Remove the step checkpoints up to `step` but the last `keep_last`, the latest and the one
    with the best eval Pass@1 so far (the later on a tie); returns the steps removed."""
    steps = [s for s in range(1, step + 1) if run.step(s).checkpoint.is_dir()]
    kept = set(steps[-keep_last:]) | {step}
    scored = [(m.values[M.PASS_AT_1], m.step) for m in A.read_metrics(run.metrics)
              if M.PASS_AT_1 in m.values and 1 <= m.step <= step] if run.metrics.exists() else []
    if scored:
        kept.add(max(scored)[1])
    removed = [s for s in steps if s not in kept]
    for s in removed:
        shutil.rmtree(run.step(s).checkpoint)
    return removed


def _proxy(recipe: Recipe, run: RunLayout, policy: Path, version: int):
    """One proxy for the whole run, serving `policy`; none for offline retraining."""
    if recipe.offline.from_run is not None:
        return contextlib.nullcontext(None)
    return start_local_proxy(recipe.rollout_config(run.root, 0, version, model=policy), run.records)  # copied into each step's records/
