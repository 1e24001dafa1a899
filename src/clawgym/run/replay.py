"""Offline re-training: replay a finished run's optimizer on its saved trees, with the run's own settings.

A run keeps every step's batch (step-NNNN/{rollouts,trees}.parquet) and every step's resolved
train config (checkpoints/step-NNNN/train_config.json). A replay trains step after step on those
batches, each step with the config the run recorded for it, changed only where the user says
(`lr=0.01`, `algo=ppo`, any TrainConfig field). Step k starts from the replay's own step k − 1
checkpoint, so its optimizer moments (optimizer.pt) and PPO value model (value/) carry over exactly
as they did in the run; step 1 starts from the policy the run's step 1 started from. At the run's
own settings the replay writes the run's checkpoints again, to float tolerance (tests/test_offline.py).

    clawgym replay RUN [OUT] [KEY=VALUE ...] [--model DIR]   # replay, then the table (cli/runs.py)
    clawgym replay RUN --table OTHER                         # only the table, labelled by folder name

`recipes/retrain-offline.sh` wraps the first; an `[offline] from_run` recipe (loop.py) takes its
per-step configs from `train_kwargs`. Works on `clawgym run`'s directories and recipes/pipeline.sh's
alike: both hold the same step folders and checkpoints (docs/architecture.md, "The run directory").
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym.artifacts import read_jsonl
from clawgym.errors import UserError
from clawgym.fields import from_text, typed
from clawgym.layout import RunLayout, StepLayout
from clawgym.train.config import PER_CALL, TrainConfig
from clawgym.train.step_metrics import reduce_updates

FILLED = PER_CALL
"""TrainConfig fields a replay fills per step (where the batch is, where to write): never recorded settings."""


def _setting(key: str, value: Any) -> Any:
    """A train setting's value as its TrainConfig field's type (a JSON 8 for a float field is 8.0)."""
    return typed(value, typing.get_type_hints(TrainConfig)[key], f"train setting '{key}'")


def parse_overrides(items: list[str] | dict[str, Any]) -> dict[str, Any]:
    """KEY=VALUE items (or a recipe's [train] table) as typed TrainConfig overrides; an unknown or
    per-step key is a UserError naming it."""
    hints = typing.get_type_hints(TrainConfig)
    known = {f.name for f in dataclasses.fields(TrainConfig)} - set(FILLED)
    if isinstance(items, dict):
        raw = dict(items)
    else:
        raw = {}
        for item in items:
            key, eq, text = item.partition("=")
            if not eq or not key:
                raise UserError(f"a replay setting expects KEY=VALUE, got {item!r}")
            raw[key] = from_text(text, hints.get(key, Any))
    for key in raw:
        if key not in known:
            raise UserError(f"unknown train setting '{key}'; known: {', '.join(sorted(known))}")
    return {k: _setting(k, v) for k, v in raw.items()}


def recorded(run: RunLayout, step: int) -> dict[str, Any]:
    """Every train setting step `step` of `run` trained with, `model` (where it started) included.

    The step's own resolved config (its checkpoint's train_config.json) when there is one; else the
    run's recipe.toml [train] with the loop's seed rule (step k: [run] seed + k) over the defaults."""
    sdir = run.step(step)
    config = sdir.checkpoint / "train_config.json"
    # A field the record lacks (a run written before the field existed) trained at its default.
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    if config.is_file():
        try:
            values = json.loads(config.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{config}: not a train config ({e})") from None
        # A number redacted as a secret by an older write_config ("token_budget"): the recipe's, else the default.
        known = {k: v for k, v in values.items() if k in defaults or k in FILLED}
        redacted = {k for k, v in known.items() if v == "<redacted>"}
        if redacted:
            recipe_train = tomllib.loads(run.recipe.read_text()).get("train", {}) if run.recipe.is_file() else {}
            known.update({k: recipe_train.get(k, defaults.get(k)) for k in redacted})
        return {**defaults, **known}
    if run.recipe.is_file():
        doc = tomllib.loads(run.recipe.read_text())
        previous = run.step(step - 1).checkpoint if step > 1 else None
        start = str(previous) if previous is not None else doc.get("model", {}).get("path", str(run.model_init))
        return {**defaults, "seed": doc.get("run", {}).get("seed", 0) + step, **doc.get("train", {}), "model": start}
    raise UserError(f"{run.root}: step {step} has no {config.relative_to(run.root)} and the run no recipe.toml; "
                    f"its train settings are unknown")


def train_kwargs(run: RunLayout, step: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """The TrainConfig settings (no per-step paths) for replaying `step`: the recorded ones, then `overrides`."""
    settings = {k: v for k, v in recorded(run, step).items() if k not in FILLED}
    return {**{k: _setting(k, v) for k, v in settings.items()}, **overrides}


def run_steps(run: RunLayout) -> list[int]:
    """The steps of a finished run that a replay can train: those with a saved batch, in order, up
    to the first that lacks one."""
    steps = []
    for sdir in run.steps():
        if sdir.step != len(steps) + 1 or not (sdir.trees.exists() and sdir.rollouts.exists()):
            break
        steps.append(sdir.step)
    if not steps:
        raise UserError(f"{run.root}: no step-0001/trees.parquet to retrain on (not a finished run?)")
    return steps


def start_policy(run: RunLayout) -> Path:
    """The policy the run's step 1 started from (its recorded `model`)."""
    path = Path(str(recorded(run, 1)["model"]))
    if not (path / "config.json").exists():
        raise UserError(f"{path}: the run's starting policy is gone; give the replay a starting policy (MODEL= for retrain-offline.sh, --model, or [model] in an [offline] recipe)")
    return path


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def change_line(run: RunLayout, steps: list[int], overrides: dict[str, Any], model: Path | None = None) -> str:
    """One line: what the replay changes from what the run recorded, or that it changes nothing."""
    changes = []
    for key, value in overrides.items():
        before = sorted({_show(_setting(key, recorded(run, s).get(key))) for s in steps})
        if before != [_show(value)]:
            changes.append(f"{key} {'/'.join(before)} → {_show(value)}")
    if model is not None and Path(model).resolve() != start_policy(run).resolve():
        changes.append(f"starting policy {start_policy(run)} → {model}")
    first = recorded(run, steps[0])
    kept = f"{first['algo']}, lr {_show(first['lr'])}, {first['epochs']} epoch(s) × {first['minibatches']} minibatch(es)"
    if not changes:
        return f"replay of {run.root}: changes nothing; every train setting as the run recorded ({kept}, seeds, …)"
    return f"replay of {run.root}: changes {'; '.join(changes)}; every other train setting as the run recorded"


@dataclass
class Replay:
    """What `replay` wrote."""

    out: Path
    steps: list[int]
    checkpoints: list[Path]


def replay(run_dir: Path, out: Path, overrides: dict[str, Any], *, model: Path | None = None,
           console=None) -> Replay:
    """Train every saved step of `run_dir` again into `out` (OUT/checkpoints/step-NNNN, OUT/step-NNNN/train.jsonl).

    Rerunning resumes: a complete checkpoint is kept, an interrupted one continues (train --resume)."""
    from clawgym.train.loop import train  # here: loading a recipe reads train_kwargs from this module, and must not load torch

    run, dest = RunLayout(run_dir), RunLayout(out)
    if Path(out).resolve() == Path(run_dir).resolve():
        raise UserError(f"{out}: the replay would overwrite the run it replays; choose another folder")
    steps = run_steps(run)
    policy = Path(model) if model is not None else start_policy(run)
    written = []
    for step in steps:
        src, sdir = run.step(step), dest.step(step)
        sdir.path.mkdir(parents=True, exist_ok=True)
        settings = train_kwargs(run, step, overrides)
        if (sdir.checkpoint / "train_config.json").is_file():  # a rerun resumes only the same replay
            before = train_kwargs(dest, step, {})
            differ = sorted(k for k in settings if _show(before.get(k)) != _show(settings[k]))
            if differ:
                raise UserError(f"{sdir.checkpoint} was trained with other settings ({', '.join(f'{k} {_show(before.get(k))}' for k in differ)}); "
                                f"choose another output folder or remove it")
        cfg = TrainConfig(trees=src.trees, rollouts=src.rollouts, model=policy, out=sdir.checkpoint,
                          metrics=sdir.train_metrics, resume=True, **settings)
        train(cfg, console)
        policy = sdir.checkpoint
        written.append(sdir.checkpoint)
    return Replay(Path(out), steps, written)


# ---------------------------------------------------------------------------------------------
# The comparison table


FIGURES = (("loss", "train/loss"), ("entropy", "train/entropy"), ("|Δlogp|", "train/mismatch_abs"))


def _updates(sdir: StepLayout) -> list[dict]:
    """A step's optimizer updates from its train.jsonl (a step that had nothing to learn has none)."""
    if not sdir.train_metrics.exists():
        return []
    return [r for r in read_jsonl(sdir.train_metrics).records if "train/loss" in r]


def _config_of(root: RunLayout, step: int) -> dict:
    f = root.step(step).checkpoint / "train_config.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def comparison(run_dir: Path, other_dir: Path, labels: tuple[str, str] = ("run", "replay")) -> str:
    """The two runs' loss, entropy and |Δlogp| side by side, under distinct headers.

    Per update when every step made as many updates in both (the same epochs × minibatches), so
    each row is one optimizer step of each; else per step, each figure the mean over the step's
    updates (the reduction of train/step_metrics.py). The header says which."""
    a, b = RunLayout(run_dir), RunLayout(other_dir)
    steps = [s.step for s in b.steps() if s.train_metrics.exists() or s.checkpoint.exists()]
    if not steps:
        raise UserError(f"{other_dir}: no trained step to compare")
    ups = {s: (_updates(a.step(s)), _updates(b.step(s))) for s in steps}
    per_update = all(len(x) == len(y) for x, y in ups.values())
    lines = []
    for label, root in zip(labels, (a, b)):
        c = _config_of(root, steps[0])
        what = f"{c.get('algo', '?')}, lr {_show(c['lr']) if 'lr' in c else '?'}, {c.get('epochs', '?')} epoch(s) × {c.get('minibatches', '?')} minibatch(es)"
        lines.append(f"{label}: {root.root} ({what})")
    lines.append("per update: each row is one optimizer step of each" if per_update else
                 "per step: each figure is the mean over the step's updates (the two made different numbers of updates)")
    heads = [f"{label} {name}" for name, _ in FIGURES for label in labels]
    width = max(14, *(len(h) + 2 for h in heads))
    lines.append(f"{'step':<10}{'update' if per_update else 'updates':>8}" + "".join(f"{h:>{width}}" for h in heads))

    def fmt(row: dict, key: str) -> str:
        v = row.get(key)
        return f"{v:.6g}" if isinstance(v, (int, float)) else "-"

    for s in steps:
        x, y = ups[s]
        if per_update:
            rows = [(str(k + 1), x[k], y[k]) for k in range(len(x))] or [("-", {}, {})]
        else:
            rows = [(f"{len(x)}/{len(y)}", reduce_updates(x) if x else {}, reduce_updates(y) if y else {})]
        for upd, rx, ry in rows:
            lines.append(f"step-{s:04d}{upd:>8}" + "".join(f"{fmt(r, key):>{width}}" for _, key in FIGURES for r in (rx, ry)))
    return "\n".join(lines)


def default_out(run_dir: Path, overrides: dict[str, Any]) -> Path:
    """RUN-replay, or RUN-lr0.01-algoppo naming the overrides."""
    tag = "-".join(f"{k}{_show(v)}" for k, v in overrides.items()) or "replay"
    return Path(f"{Path(run_dir).resolve()}-{tag}")


def start(run_dir: Path, out: Path | None, items: list[str], model: Path | None, force: bool) -> tuple[RunLayout, list[int], Path, dict[str, Any]]:
    """Check a replay's arguments before anything is written: (the run, its steps, OUT, the typed
    changes). With `force`, OUT's earlier replay is deleted first."""
    import shutil

    if not Path(run_dir).is_dir():
        raise UserError(f"{run_dir}: no such run directory")
    overrides = parse_overrides(items)
    run = RunLayout(run_dir)
    steps = run_steps(run)
    out = Path(out) if out is not None else default_out(run_dir, overrides)
    if out.resolve() == Path(run_dir).resolve():
        raise UserError(f"{out}: the replay would overwrite the run it replays; choose another folder")
    if model is not None and not (Path(model) / "config.json").exists():
        raise UserError(f"{model}: not a model directory (no config.json)")
    if model is None:
        start_policy(run)  # a run whose starting policy is gone is refused here, not after its first step
    if force and out.exists():
        shutil.rmtree(out)
    return run, steps, out, overrides
