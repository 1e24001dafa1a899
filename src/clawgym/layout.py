"""The run directory's layout: one typed owner of every path a run, a step or a stage output holds.

Stages and the loop ask these objects for paths instead of spelling `step-0001` or `trees.parquet`
themselves, so the layout documented in docs/architecture.md ("The run directory") lives here once:

    RunLayout(root)            RUN/: recipe.toml, metrics.jsonl, model-init/, records/, plots/, ...
    RunLayout.step(n)          RUN/step-NNNN as a StepLayout, with its checkpoint and eval folder
    StepLayout(path)           any folder of stage outputs: rollouts, calls, trees, train.jsonl, ...

A StepLayout also describes a folder a stage command is pointed at (`clawgym build-trees DIR`,
`clawgym train DIR`), the cold start's RUN/sft and an evaluation's RUN/eval/LABEL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_STEP_NAME = re.compile(r"step-(\d+)")


def step_name(step: int) -> str:
    """The folder name of loop step `step` (1-based), e.g. step-0003."""
    return f"step-{step:04d}"


def parse_step_name(name: str) -> int | None:
    """The step number of a folder named like `step_name`, else None."""
    match = _STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class StepLayout:
    """A folder of stage outputs: what rollout, build-trees, train and eval write into it."""

    path: Path
    step: int | None = None
    """the loop step it belongs to (0: the cold start); None for a folder outside a run"""
    checkpoint: Path | None = None
    """where train writes this folder's policy (RUN/checkpoints/step-NNNN); None outside a run"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    # rollout (rollout/runner.py)
    @property
    def rollout_config(self) -> Path:
        return self.path / "rollout.config.json"

    @property
    def results(self) -> Path:
        """one fsync'd row per finished rollout (what a rerun resumes from)"""
        return self.path / "results.jsonl"

    @property
    def transcripts(self) -> Path:
        return self.path / "transcripts.jsonl"

    @property
    def records(self) -> Path:
        """the proxy's raw call records of these rollouts, ROLLOUT.jsonl each"""
        return self.path / "records"

    @property
    def rollouts(self) -> Path:
        return self.path / "rollouts.parquet"

    @property
    def calls(self) -> Path:
        return self.path / "calls.parquet"

    # build-trees (trees/stage.py)
    @property
    def trees(self) -> Path:
        return self.path / "trees.parquet"

    @property
    def trees_config(self) -> Path:
        return config_beside(self.trees)

    @property
    def trees_metrics(self) -> Path:
        """the trees/ metrics line of a loop step (the stage command appends to the run's metrics.jsonl)"""
        return self.path / "trees.metrics.jsonl"

    # train (train/loop.py)
    @property
    def train_metrics(self) -> Path:
        """one line per optimizer update"""
        return self.path / "train.jsonl"

    # eval (run/eval.py)
    @property
    def eval_md(self) -> Path:
        return self.path / "eval.md"

    @property
    def eval_json(self) -> Path:
        return self.path / "eval.json"

    def in_run(self) -> tuple[RunLayout, int] | None:
        """The run this folder is a step of and the step's number, judged by its name (RUN/step-NNNN), else None."""
        path = self.path.resolve()
        number = parse_step_name(path.name)
        return None if number is None else (RunLayout(path.parent), number)


def config_beside(out: Path) -> Path:
    """The resolved-config file a stage writes next to its output: trees.parquet → trees.config.json."""
    out = Path(out)
    return out.with_name(out.stem + ".config.json")


@dataclass(frozen=True)
class RunLayout:
    """A run directory (`clawgym run`, or recipes/pipeline.sh's chained stages)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def recipe(self) -> Path:
        """the resolved recipe; a resumed run must match it"""
        return self.root / "recipe.toml"

    @property
    def metrics(self) -> Path:
        """one line per step: the source of truth every other sink copies"""
        return self.root / "metrics.jsonl"

    @property
    def model_init(self) -> Path:
        """the starting policy a recipe's [model] init made"""
        return self.root / "model-init"

    @property
    def records(self) -> Path:
        """where the run's one proxy records every call (copied into each step's records/)"""
        return self.root / "records"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        """[log] tensorboard: the event files"""
        return self.root / "tensorboard"

    @property
    def wandb(self) -> Path:
        """[log] wandb: the W&B run folders (offline runs sync from here)"""
        return self.root / "wandb"

    @property
    def table_md(self) -> Path:
        """Pass@1 by category: base, SFT, SFT+RL (a recipe with [sft] and [eval])"""
        return self.root / "table.md"

    @property
    def table_json(self) -> Path:
        return self.root / "table.json"

    def step(self, n: int) -> StepLayout:
        """Loop step n (1-based): RUN/step-NNNN, trained into RUN/checkpoints/step-NNNN."""
        return StepLayout(self.root / step_name(n), n, self.checkpoints / step_name(n))

    @property
    def sft(self) -> StepLayout:
        """The [sft] cold start: the teacher's rollouts and trees, trained into RUN/checkpoints/sft."""
        return StepLayout(self.root / "sft", 0, self.checkpoints / "sft")

    @property
    def cold_start_seconds(self) -> Path:
        """RUN/sft/seconds.json: the wall seconds and peak resident memory of each cold-start stage that
        ran (run/coldstart.py), by metrics key; a resumed cold start adds the stages it ran to those already there."""
        return self.root / "sft" / "seconds.json"

    def eval(self, label: int | str) -> StepLayout:
        """An evaluation's folder: RUN/eval/step-NNNN after step n, or RUN/eval/base, RUN/eval/sft."""
        return StepLayout(self.root / "eval" / (step_name(label) if isinstance(label, int) else label))

    def steps(self) -> list[StepLayout]:
        """The step folders on disk, in step order."""
        found = [(parse_step_name(p.name), p) for p in self.root.glob("step-*") if p.is_dir()]
        return [self.step(n) for n, _ in sorted(found, key=lambda t: t[0] or 0) if n is not None]

    def evals(self) -> list[tuple[int, StepLayout]]:
        """The per-step evaluations on disk (RUN/eval/step-NNNN), in step order."""
        found = [(parse_step_name(p.name), p) for p in (self.root / "eval").glob("step-*") if p.is_dir()]
        return [(n, self.eval(n)) for n, _ in sorted(found, key=lambda t: t[0] or 0) if n is not None]
