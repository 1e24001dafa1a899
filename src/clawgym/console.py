"""The one console every stage prints through, and what `clawgym run` prints per step.

Everything human-readable goes to stderr through `STDERR` (a rich Console that looks up sys.stderr
at print time, so captured and redirected streams work); stdout is left to a command's result
(its summary line, or its `--json` object). A stage takes a console argument: the stage commands
pass `STDERR` and print their tables; `clawgym run` passes `QUIET` unless --verbose, and prints one
line per step (`step_line`) under one progress bar over the steps (`StepProgress`).
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from clawgym import metrics as M

OFF_TTY_WIDTH = 200
"""the width tables are laid out for when the stream is a file or pipe (rich would assume 80)"""


class TableConsole(Console):
    """A Console whose tables never cut a cell short: a column that does not fit folds its text
    onto the next line instead of ending it in "…" (rich's default), so every number prints whole."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for obj in objects:
            if isinstance(obj, Table):
                for column in obj.columns:
                    if column.overflow == "ellipsis":
                        column.overflow = "fold"
        super().print(*objects, **kwargs)


def console(stderr: bool = False) -> Console:
    """A TableConsole on stdout or stderr: the terminal's width on a terminal, OFF_TTY_WIDTH columns
    (or $COLUMNS) off one, so a table in a log file or pipe keeps its layout."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else OFF_TTY_WIDTH
    return TableConsole(stderr=stderr, soft_wrap=True, width=width)  # a long line stays one line in a log


class TableRecorder(TableConsole):
    """A console that prints nothing and keeps what would have been printed as plain data: each table
    as {title, rows: [{column: value}]} (numbers as numbers), each line of text as a string. It gives
    a command that prints tables its `--json` (`clawgym inspect --json`)."""

    def __init__(self) -> None:
        super().__init__(file=io.StringIO(), width=OFF_TTY_WIDTH)
        self.tables: list[dict[str, Any]] = []
        self.lines: list[str] = []

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for obj in objects:
            if isinstance(obj, Table):
                self.tables.append(table_data(obj))
            elif isinstance(obj, (str, Text)):
                self.lines.append(_plain(obj))


def _plain(value: Any) -> str:
    if isinstance(value, Text):
        return value.plain
    return Text.from_markup(value).plain if isinstance(value, str) else str(value)


def _value(cell: Any) -> Any:
    """A table cell as JSON: an int or float when the text is one (thousands separators dropped), else the text."""
    text = _plain(cell).strip()
    bare = text.replace(",", "")
    for kind in (int, float):
        try:
            return kind(bare)
        except ValueError:
            pass
    return text


def table_data(table: Table) -> dict[str, Any]:
    """A rich Table's title and rows as plain data."""
    names = [_plain(c.header) for c in table.columns]
    columns = [list(c.cells) for c in table.columns]
    rows = [dict(zip(names, map(_value, row))) for row in zip(*columns)]
    return {"title": _plain(table.title) if table.title else None, "rows": rows}


STDERR = console(stderr=True)
# soft_wrap: a printed line stays one line when stderr is a file or pipe (rich would break it at 80
# columns there); tables still fit the width.
QUIET = Console(file=io.StringIO(), quiet=True)
"""a console that prints nothing: the stages' tables under `clawgym run` without --verbose (not a
terminal, so a stage's progress bar on it does not capture what other code prints to stderr)"""

# (metrics key, format) of the step line's optional figures; the KL to a reference policy, when
# trained with one, replaces the rollout-trainer mismatch. The train/ and trees/ names are those of
# train.step_metrics and trees.stats (metrics.FAMILIES); a test checks that each is a known key.
FIELDS = ((M.PASS_AT_1, "pass@1 {:.1%}"), ("train/kl_ref", "kl {:.4f}"), ("train/mismatch_abs", "mismatch {:.4f}"),
          ("train/clip_frac", "clip {:.3f}"), ("train/grad_norm", "grad {:.2f}"), ("train/tokens_per_s", "{:,.0f} tok/s"))
TREE_RATIO, TOKENS_SAVED = "trees/tree_token_ratio", "trees/tokens_saved"


def duration(seconds: float) -> str:
    """A short human duration: 42s, 3m05s, 2h14m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def step_line(step: int, steps: int, values: dict[str, float], eta_s: float | None) -> str:
    """One readable line of a step's metrics.jsonl values, e.g.

        step 3/8  reward 0.412 ± 0.180  pass@1 52.0%  mismatch 0.0012  clip 0.000  grad 1.98  2,466 tok/s
        tree 0.36 (49,040 tok saved)  prefix cache 91% hit, 9% computed | rollout 1m26s  trees 2s  train 5s  sync 1s  eval 20s
        | peak GiB rollout 2.1  trees 0.9  train 4.2  sync 1.6  eval 2.0 | ETA 8m12s

    Metrics absent from `values` are left out.
    """
    v = values
    parts = [f"step {step}/{steps}", f"reward {v.get(M.REWARD_MEAN, 0.0):.3f} ± {v.get(M.REWARD_STD, 0.0):.3f}"]
    shown = [key for key, _ in FIELDS if key in v and not (key == "train/mismatch_abs" and "train/kl_ref" in v)]
    parts += [fmt.format(v[key]) for key, fmt in FIELDS if key in shown]
    if TREE_RATIO in v:  # what tree packing saved over forwarding every call on its own
        parts.append(f"tree {v[TREE_RATIO]:.2f} ({v.get(TOKENS_SAVED, 0.0):,.0f} tok saved)")
    if M.PREFIX_HIT_RATE in v:  # what the engine's prefix cache spared the step's prompts (docs/engines.md)
        parts.append(f"prefix cache {v[M.PREFIX_HIT_RATE]:.0%} hit, {v.get(M.PROMPT_COMPUTED_SHARE, 1.0):.0%} computed")
    phases = [f"{p.label} {duration(v[p.key])}" for p in M.PHASES if p.key in v]
    peaks = [f"{p.label} {v[p.peak_key]:.1f}" for p in M.PHASES if p.peak_key in v]
    line = "  ".join(parts)
    if phases:
        line += " | " + "  ".join(phases)
    if peaks:  # the process's resident high-water mark in each phase: the trainer's, the engine's
        line += " | peak GiB " + "  ".join(peaks)
    if eta_s is not None:
        line += f" | ETA {duration(eta_s)}"
    return line


def cold_start_line(values: dict[str, float]) -> str:
    """The step-0 line after an [sft] cold start: teacher reward, SFT loss, Pass@1 before and after."""
    v = values
    parts = [f"step 0 (SFT cold start)  teacher reward {v.get(M.TEACHER_REWARD_MEAN, 0.0):.3f}"]
    if M.SFT_LOSS_FIRST in v:
        parts.append(f"sft loss {v[M.SFT_LOSS_FIRST]:.3f} → {v[M.SFT_LOSS_LAST]:.3f}")
    base = f"{M.EVAL_BASE}pass@1"
    if base in v and M.PASS_AT_1 in v:
        parts.append(f"pass@1 {v[base]:.1%} → {v[M.PASS_AT_1]:.1%}")
    line = "  ".join(parts)
    phases = [f"{p.label} {duration(v[p.key])}" for p in M.COLD_START_PHASES if p.key in v]
    return line + (" | " + "  ".join(phases) if phases else "")


class StepProgress:
    """One progress bar over a run's steps; step lines print above it, the current phase beside it."""

    def __init__(self, console: Console, steps: int, done: int):
        self.console, self.steps = console, steps
        self.progress = Progress(TextColumn("[bold]steps"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.bar = self.progress.add_task("", total=steps, completed=done)
        self.timed: list[float] = []  # seconds of the steps run in this process (resumed ones excluded)

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def phase(self, step: int, name: str) -> None:
        eta = self.eta(step - 1)
        self.progress.update(self.bar, description=f"step {step}: {name}" + (f"  ETA {duration(eta)}" if eta is not None else ""))

    def eta(self, done: int) -> float | None:
        """Seconds left after `done` steps, from the mean time of the steps this process ran."""
        if not self.timed:
            return None
        return (self.steps - done) * sum(self.timed) / len(self.timed)

    def finished(self, step: int, values: dict[str, float], seconds: float | None) -> None:
        """Print the step's line and advance; `seconds` None: the step was trained before a resume."""
        if seconds is not None:
            self.timed.append(seconds)
        self.progress.update(self.bar, completed=step, description="")
        self.console.print(step_line(step, self.steps, values, self.eta(step) if step < self.steps else None),
                           highlight=False, soft_wrap=True)
