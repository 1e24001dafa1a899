"""`clawgym eval`: Pass@1 of a policy on a task set through a harness, per task and per category (paper Table 1).

Evaluation is a rollout run without training: every task is solved K times (`--n`), each rollout
scored by the verifier (hybrid: 0.7 code + 0.3 rubric where a task has both and a judge is set).
A task's Pass@1 is the mean score over its K samples; a category's is the mean over its tasks; the
overall figure is the mean over all tasks. Rollouts excluded as infra or check errors do not count (and
are reported). The tables are written as eval.md and eval.json in the output folder.

An evaluation through several harnesses (a mix-harness policy) also reports each harness on its
own, the same figures over that harness's rollouts only: a row per harness beside the pooled one
in the tables, `per_harness` in eval.json, `HARNESS/pass@1` among the metrics. The pooled figure
alone could hide a policy that works in one harness and fails in another.
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
from clawgym.rollout.runner import run_rollouts
from clawgym.run import metrics as M


@dataclass
class EvalReport:
    per_task: dict[str, float]
    """task id -> mean score over its scored samples"""
    category_of: dict[str, str]
    samples: dict[str, int]
    """task id -> scored samples"""
    excluded: int
    harnesses: list[str] = field(default_factory=list)
    per_harness: dict[str, EvalReport] = field(default_factory=dict)
    """harness -> the report over its rollouts alone; empty for a single-harness evaluation"""

    @property
    def overall(self) -> float:
        return statistics.fmean(self.per_task.values()) if self.per_task else 0.0

    def per_category(self) -> dict[str, float]:
        cats: dict[str, list[float]] = {}
        for task, score in self.per_task.items():
            cats.setdefault(self.category_of.get(task) or "uncategorized", []).append(score)
        return {c: statistics.fmean(v) for c, v in sorted(cats.items())}

    def metrics(self) -> dict[str, float]:
        return M.eval_figures(self.to_json())

    def to_json(self, judge: bool = False) -> dict:
        """eval.json's document (what `metrics.eval_figures` and the run's table read back)."""
        doc = {"pass@1": self.overall, "per_category": self.per_category(), "per_task": self.per_task,
               "samples": self.samples, "excluded": self.excluded, "harnesses": self.harnesses, "judge": judge}
        if self.per_harness:
            doc["per_harness"] = {h: {"pass@1": sub.overall, "per_category": sub.per_category(), "excluded": sub.excluded}
                                  for h, sub in self.per_harness.items()}
        return doc

    def _rows(self) -> list[tuple[str, list[str]]]:
        """(label, cells) per table row: one per harness, then the pooled row; cells in %, '-' where absent."""
        cats = self.per_category()
        reports = [*((h, sub) for h, sub in self.per_harness.items()),
                   ((f"all ({', '.join(self.harnesses)})" if self.per_harness else ", ".join(self.harnesses)), self)]
        rows = []
        for label, rep in reports:
            mine = rep.per_category()
            rows.append((label, [f"{100 * mine[c]:.1f}" if c in mine else "-" for c in cats] + [f"{100 * rep.overall:.1f}"]))
        return rows

    def markdown(self) -> str:
        cats = self.per_category()
        head = "| harness | " + " | ".join(cats) + " | overall |"
        sep = "|---|" + "---|" * len(cats) + "---|"
        rows = [f"| {label} | " + " | ".join(cells) + " |" for label, cells in self._rows()]
        tasks = ["", "| task | category | samples | Pass@1 |", "|---|---|---|---|"]
        tasks += [f"| {t} | {self.category_of.get(t, '')} | {self.samples[t]} | {100 * s:.1f} |" for t, s in sorted(self.per_task.items())]
        note = f"\nPass@1 in %, the mean score over each task's samples; {self.excluded} rollout(s) excluded (infra or check errors).\n"
        return "\n".join([head, sep, *rows, *tasks]) + "\n" + note

    def print(self, console: Console) -> None:
        t = Table("harness", *self.per_category(), "overall", title="Pass@1 (%) by category", title_justify="left")
        for label, cells in self._rows():
            t.add_row(label, *cells)
        console.print(t)
        if self.excluded:
            console.print(f"[yellow]{self.excluded} rollout(s) excluded (infra or check errors)[/]")


def pass_table(rows: dict[str, dict]) -> str:
    """Table 1 style markdown: one row per labelled eval.json (e.g. base, SFT, SFT+RL), columns its
    categories; an evaluation through several harnesses adds a row per harness under its own."""
    cats = sorted({c for doc in rows.values() for c in doc["per_category"]})
    lines = ["| policy | " + " | ".join(cats) + " | overall |", "|---|" + "---|" * (len(cats) + 1)]

    def line(label: str, doc: dict) -> str:
        cells = [f"{100 * doc['per_category'][c]:.1f}" if c in doc["per_category"] else "-" for c in cats]
        return f"| {label} | " + " | ".join(cells) + f" | {100 * doc['pass@1']:.1f} |"

    for label, doc in rows.items():
        lines.append(line(label, doc))
        lines += [line(f"{label} · {h}", sub) for h, sub in doc.get("per_harness", {}).items()]
    return "\n".join(lines) + "\n\nHeld-out Pass@1 in %, the mean score over each task's samples.\n"


def report_from_rollouts(rollouts: list[A.RolloutRecord]) -> EvalReport:
    """The report over `rollouts`; through more than one harness, with each harness's own report."""
    harnesses = sorted({r.harness for r in rollouts})
    per_harness = {h: report_from_rollouts([r for r in rollouts if r.harness == h]) for h in harnesses} if len(harnesses) > 1 else {}
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
                      harnesses=harnesses, per_harness=per_harness)


def evaluate(config, console: Console | None = None, proxy=None) -> EvalReport:
    """Run the rollouts of `config` (a RolloutConfig) and write eval.md / eval.json beside them."""
    console = console or STDERR
    summary = run_rollouts(config, console, proxy=proxy)
    report = report_from_rollouts(summary.rollouts)
    out = StepLayout(Path(config.out))
    A.atomic_write_bytes(out.eval_md, report.markdown().encode())
    A.atomic_write_bytes(out.eval_json, orjson.dumps(report.to_json(judge=config.verifier.judge is not None),
                                                     option=orjson.OPT_INDENT_2))
    summary.check_scored()  # a table of nothing but infra errors is no 0% result
    return report
