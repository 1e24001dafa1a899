"""`clawgym eval`: Pass@1 of a policy on a task set through a harness, per task and per category (paper Table 1).

Evaluation is a rollout run without training: every task is solved K times (`--n`), each rollout
scored by the verifier (hybrid: 0.7 code + 0.3 rubric where a task has both and a judge is set).
A task's Pass@1 is the mean score over its K samples; a category's is the mean over its tasks; the
overall figure is the mean over all tasks. Rollouts excluded as infra errors do not count (and
are reported). The tables are written as eval.md and eval.json in the output folder.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from clawgym import artifacts as A
from clawgym.console import STDERR
from clawgym.layout import StepLayout


@dataclass
class EvalReport:
    per_task: dict[str, float]
    """task id -> mean score over its scored samples"""
    category_of: dict[str, str]
    samples: dict[str, int]
    """task id -> scored samples"""
    excluded: int
    harnesses: list[str] = field(default_factory=list)

    @property
    def overall(self) -> float:
        return statistics.fmean(self.per_task.values()) if self.per_task else 0.0

    def per_category(self) -> dict[str, float]:
        cats: dict[str, list[float]] = {}
        for task, score in self.per_task.items():
            cats.setdefault(self.category_of.get(task) or "uncategorized", []).append(score)
        return {c: statistics.fmean(v) for c, v in sorted(cats.items())}

    def metrics(self) -> dict[str, float]:
        out = {"pass@1": self.overall, "excluded": float(self.excluded)}
        out.update({f"pass@1/{c}": v for c, v in self.per_category().items()})
        return out

    def markdown(self) -> str:
        cats = self.per_category()
        head = "| harness | " + " | ".join(cats) + " | overall |"
        sep = "|---|" + "---|" * len(cats) + "---|"
        row = f"| {', '.join(self.harnesses)} | " + " | ".join(f"{100 * v:.1f}" for v in cats.values()) + f" | {100 * self.overall:.1f} |"
        tasks = ["", "| task | category | samples | Pass@1 |", "|---|---|---|---|"]
        tasks += [f"| {t} | {self.category_of.get(t, '')} | {self.samples[t]} | {100 * s:.1f} |" for t, s in sorted(self.per_task.items())]
        note = f"\nPass@1 in %, the mean score over each task's samples; {self.excluded} rollout(s) excluded as infra errors.\n"
        return "\n".join([head, sep, row, *tasks]) + "\n" + note

    def print(self, console: Console) -> None:
        cats = self.per_category()
        t = Table("harness", *cats, "overall", title="Pass@1 (%) by category", title_justify="left")
        t.add_row(", ".join(self.harnesses), *(f"{100 * v:.1f}" for v in cats.values()), f"{100 * self.overall:.1f}")
        console.print(t)
        if self.excluded:
            console.print(f"[yellow]{self.excluded} rollout(s) excluded as infra errors[/]")


def pass_table(rows: dict[str, dict]) -> str:
    """Table 1 style markdown: one row per labelled eval.json (e.g. base, SFT, SFT+RL), columns its categories."""
    cats = sorted({c for doc in rows.values() for c in doc["per_category"]})
    lines = ["| policy | " + " | ".join(cats) + " | overall |", "|---|" + "---|" * (len(cats) + 1)]
    for label, doc in rows.items():
        cells = [f"{100 * doc['per_category'][c]:.1f}" if c in doc["per_category"] else "-" for c in cats]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {100 * doc['pass@1']:.1f} |")
    return "\n".join(lines) + "\n\nHeld-out Pass@1 in %, the mean score over each task's samples.\n"


def report_from_rollouts(rollouts: list[A.RolloutRecord]) -> EvalReport:
    scores: dict[str, list[float]] = {}
    category_of: dict[str, str] = {}
    excluded = 0
    for r in rollouts:
        category_of[r.task_id] = r.category
        if r.reward is None:
            excluded += 1
            continue
        scores.setdefault(r.task_id, []).append(r.reward)
    return EvalReport(per_task={t: statistics.fmean(v) for t, v in scores.items()}, category_of=category_of,
                      samples={t: len(v) for t, v in scores.items()}, excluded=excluded,
                      harnesses=sorted({r.harness for r in rollouts}))


def evaluate(config, console: Console | None = None, proxy=None) -> EvalReport:
    """Run the rollouts of `config` (a RolloutConfig) and write eval.md / eval.json beside them."""
    from clawgym.rollout.runner import run_rollouts

    console = console or STDERR
    summary = run_rollouts(config, console, proxy=proxy)
    report = report_from_rollouts(summary.rollouts)
    out = StepLayout(Path(config.out))
    A.atomic_write_bytes(out.eval_md, report.markdown().encode())
    A.atomic_write_bytes(out.eval_json, orjson.dumps({
        "pass@1": report.overall, "per_category": report.per_category(), "per_task": report.per_task,
        "samples": report.samples, "excluded": report.excluded, "harnesses": report.harnesses,
        "judge": config.verifier.judge is not None,
    }, option=orjson.OPT_INDENT_2))
    return report
