"""The commands over whole runs: run (the loop), eval, compare, replay, mismatch, inspect."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import typer

from clawgym.cli.app import AFTER_STOP, FORCE_HELP, JSON_HELP, app, err, json_result, with_fields
from clawgym.cli.stages import ROLLOUT_SKIP, EngineShorthands, rollout_config_of
from clawgym.console import console as out_console
from clawgym.errors import UserError, check_out_dir
from clawgym.layout import RunLayout, StepLayout
from clawgym.rollout.config import JudgeChoice, RolloutConfig
from clawgym.run.recipe import EvalSection

# --- loop and evaluation -----------------------------------------------------------------------


@app.command("run")
def run(
    recipe: Path = typer.Argument(..., metavar="RECIPE.toml", help="The recipe: one section per stage (docs/recipes.md)."),
    overrides: Optional[list[str]] = typer.Argument(None, metavar="[SECTION.KEY=VALUE]...",
                                                    help="Set recipe keys over the file's, typed by the key (train.lr=0.1, "
                                                         "rollout.group_size=4, rollout.agentloop.max_tokens=8); saved in RUN/recipe.toml."),
    resume: bool = typer.Option(False, "--resume", help="Continue a killed run from its last complete stage."),
    force: bool = typer.Option(False, "--force", help="Delete the run's folder (RUN: [run] name beside the recipe) and start it anew."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print every stage's tables (rollouts, trees, train updates) each step."),
) -> None:
    """Run the RL loop: collect → reconstruct → optimize → sync, step after step, with metrics and plots.

    Prints one line per step (reward, held-out Pass@1, mismatch, clip, grad norm, tokens/s, seconds
    per phase, ETA) under a progress bar over the steps; --verbose adds each stage's own tables.

    Example: clawgym run recipes/quickstart.toml

    Example: clawgym run recipes/toy.toml run.name=toy-lr train.lr=0.01 run.steps=4
    """
    import shlex

    from clawgym.run.loop import run as _run

    if resume and force:
        raise UserError("--resume continues the run and --force deletes it: give one")
    AFTER_STOP.append("continue with: " + shlex.join(["clawgym", "run", str(recipe), *(overrides or []), "--resume"]))
    lines = _run(recipe, overrides=overrides or [], resume=resume, force=force, console=err, verbose=verbose)
    steps = [line for line in lines if line.step >= 1]  # step 0 is the [sft] cold start's line, not an RL step
    if steps:
        last = steps[-1].values
        typer.echo(f"{len(steps)} steps; last mean reward {last.get('rollout/reward_mean', 0):.3f}")


def eval_(json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
          force: bool = typer.Option(False, "--force", help=FORCE_HELP), **options: Any) -> None:
    """Evaluate a policy: Pass@1 per task and per category (like the paper's Table 1), as markdown and JSON.

    The rollouts run as `clawgym rollout` runs them, with the same options; --samples-per-task stands for --group-size, with its own default.

    Example: clawgym eval --tasks recipes/tasks/toy --harness agentloop --model runs/toy/checkpoints/step-0008 --samples-per-task 4 --out runs/eval
    """
    from clawgym.run.eval import evaluate
    from clawgym.settings import rollout_rerun

    cfg = rollout_config_of(options)
    check_out_dir(cfg.out, "--out")
    rollout_rerun(cfg, force=force, console=err, evaluation=True)
    with json_result(json_out) as report:
        scores = evaluate(cfg, err)
        scores.print(out_console())
        if cfg.verifier.judge is None:
            typer.echo("no judge configured: code scores only")
        out = StepLayout(cfg.out)
        doc = scores.to_json(judge=cfg.verifier.judge is not None)
        report(f"Pass@1 {100 * scores.overall:.1f}%; wrote {out.eval_md} and {out.eval_json}",
               {"out": cfg.out.resolve(), "eval_json": out.eval_json.resolve(),
                **{k: doc[k] for k in ("pass@1", "per_category", "excluded", "judge", "per_harness") if k in doc}})


with_fields(eval_, RolloutConfig, JudgeChoice, EngineShorthands, skip=ROLLOUT_SKIP, fields_from={"group_size": (EvalSection, "samples_per_task")})
app.command("eval")(eval_)


def compare_(policy: list[str] = typer.Option(..., "--policy", metavar="NAME=MODEL_DIR",
                                             help="A policy to evaluate (a row of the table); repeat for several."),
             json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
             force: bool = typer.Option(False, "--force", help=FORCE_HELP), **options: Any) -> None:
    """Evaluate several policies in several harnesses: one held-out Pass@1 table, rows policies, columns harnesses.

    Each policy is evaluated as `clawgym eval` does, over every --harness, in OUT/<policy>/ (a rerun
    resumes, and one with more harnesses or a larger --samples-per-task runs only what it adds); each cell is Pass@1
    ± its standard error over tasks. Writes OUT/table.md,
    OUT/table.json and OUT/table.png (docs/recipes.md, "Comparing harnesses").

    Example: clawgym compare --policy base=models/smol --policy sft=runs/cc/checkpoints/sft --tasks tasks/heldout --harness agentloop,claude-code,codex --samples-per-task 2 --out runs/table
    """
    from clawgym.run.compare import compare, markdown, parse_policies

    policies = parse_policies(policy)
    cfg = rollout_config_of({**options, "model": next(iter(policies.values()))})
    check_out_dir(cfg.out, "--out")
    with json_result(json_out) as report:
        cells = compare(policies, cfg, cfg.out, err, force=force)
        out_console().print(markdown(cells), markup=False)
        report(f"wrote {cfg.out / 'table.md'}, {cfg.out / 'table.json'} and {cfg.out / 'table.png'}",
               {"out": cfg.out.resolve(), "cells": [dataclasses.asdict(c) for c in cells]})


with_fields(compare_, RolloutConfig, JudgeChoice, EngineShorthands, skip=ROLLOUT_SKIP | {"model"},
             fields_from={"group_size": (EvalSection, "samples_per_task")})
app.command("compare")(compare_)


@app.command("replay")
def replay(
    run_dir: Path = typer.Argument(..., metavar="RUN", help="A finished run: `clawgym run`'s folder or recipes/pipeline.sh's."),
    rest: Optional[list[str]] = typer.Argument(None, metavar="[OUT] [KEY=VALUE]...",
                                               help="Where the replay writes (default RUN-replay, or RUN-lr0.01 naming the "
                                                    "changes), then the train settings to change (`clawgym train --help`)."),
    model: Optional[Path] = typer.Option(None, "--model", help="Start from this policy instead of the one the run's step 1 started from."),
    table: Optional[Path] = typer.Option(None, "--table", metavar="OTHER",
                                         help="Train nothing: print RUN's and OTHER's training figures side by side."),
    force: bool = typer.Option(False, "--force", help="Delete OUT's earlier replay and train it anew (a rerun otherwise resumes)."),
    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Train a finished run's saved batches again, offline: every step with the settings the run recorded, changed only where you say.

    Step k starts from the replay's step k − 1, optimizer moments and PPO value model included, as the
    run's did; with no change the replay writes the run's checkpoints again (to float tolerance).
    Prints one line saying what changes, then the run's and the replay's loss, entropy and |Δlogp|
    side by side. Rerunning resumes; other settings into the same OUT are refused (--force starts over).

    Example: clawgym replay recipes/runs/quickstart lr=0.01

    Example: clawgym replay recipes/runs/quickstart runs/qs-ppo algo=ppo minibatches=4
    """
    from clawgym.run import replay as offline

    items = list(rest or [])
    if table is not None:
        if items or model is not None or force:
            raise UserError("--table compares two finished folders and trains nothing: give it no OUT, changes, --model or --force")
        names = (run_dir.name, table.name) if run_dir.name != table.name else ("first", "second")
        typer.echo(offline.comparison(run_dir, table, names))
        return
    out = Path(items.pop(0)) if items and "=" not in items[0] else None
    run, steps, out, changes = offline.start(run_dir, out, items, model, force)
    with json_result(json_out) as report:
        typer.echo(offline.change_line(run, steps, changes, model))
        done = offline.replay(run_dir, out, changes, model=model, console=err)
        typer.echo(offline.comparison(run_dir, out))
        report(f"replayed checkpoints: {RunLayout(out).checkpoints}",
               {"out": out.resolve(), "steps": done.steps, "checkpoints": [c.resolve() for c in done.checkpoints],
                "changes": {k: str(v) if isinstance(v, Path) else v for k, v in changes.items()}})


# --- engines -----------------------------------------------------------------------------------


@app.command("mismatch")
def mismatch(
    calls: list[Path] = typer.Option(..., "--calls", help="calls.parquet sampled by an engine; repeat to compare engines in one table."),
    model: Path = typer.Option(..., "--model", help="The checkpoint that sampled them (HF directory), as the trainer loads it."),
    policy_version: Optional[int] = typer.Option(None, "--only-version", "--policy-version",
                                                 help="Only calls of this policy version (needed when a file mixes versions; "
                                                      "old name: --policy-version)."),
    max_calls: Optional[int] = typer.Option(None, "--sample-calls", "--max-calls", min=1,
                                            help="Measure at most this many calls per file (old name: --max-calls)."),
    json_out: bool = typer.Option(False, "--json", help="Print the measurements as one JSON object on stdout (the table goes to stderr)."),
) -> None:
    """Compare the engine's logprobs of sampled tokens with the trainer's fp32 recomputation.

    Prints mean and max |Δlogp|, k3 KL(rollout ‖ trainer) and the share of tokens whose ratio lies
    outside [0.5, 2] — the mismatch that token-level TIS corrects (paper §3.2.4).

    Example: clawgym mismatch --calls runs/demo/step-0001/calls.parquet --model models/tiny
    """
    from clawgym.run.mismatch import run_mismatch

    rows = run_mismatch(calls, model, err if json_out else out_console(), policy_version=policy_version, max_calls=max_calls)
    if json_out:
        import orjson

        typer.echo(orjson.dumps({"model": str(model), "files": [dataclasses.asdict(r) for r in rows]}).decode())


# --- looking at artifacts ----------------------------------------------------------------------


@app.command("inspect")
def inspect(
    path: Path = typer.Argument(..., metavar="PATH", help="A Parquet artifact, a JSONL log, a model directory, or a run directory."),
    rollout: Optional[str] = typer.Option(None, help="For trees.parquet: draw this rollout's tree; for transcripts.jsonl: print its conversation."),
    tokenizer: Optional[Path] = typer.Option(None, help="For trees.parquet: a model dir whose tokenizer decodes node text."),
    json_out: bool = typer.Option(False, "--json", help="Print what the tables show as one JSON object on stdout: "
                                                         "{path, lines, tables: [{title, rows: [{column: value}]}]}."),
) -> None:
    """Print a readable summary of any clawgym artifact or model directory.

    Example: clawgym inspect runs/demo/step-0001/calls.parquet
    """
    from clawgym.run.inspection import inspect_path

    if not json_out:
        inspect_path(path, out_console(), rollout=rollout, tokenizer=tokenizer)
        return
    import orjson

    from clawgym.console import TableRecorder

    recorder = TableRecorder()
    inspect_path(path, recorder, rollout=rollout, tokenizer=tokenizer)
    typer.echo(orjson.dumps({"path": str(path), "lines": recorder.lines, "tables": recorder.tables}).decode())


