"""`clawgym tasks validate DIR`: parse every task, run its verifier on the untouched workspace.

For each task folder: load it (errors name the folder and field), materialize the workspace in a
fresh sandbox, copy the hidden tests in, run the code checks as if the harness had done nothing,
and report that no-op score with the task's flags (network, browser, judge, binary, ...). A good
task scores 0 when nothing was done; a positive no-op score is free credit the reward carries.
The summary counts tasks by flag and shows the distribution of no-op scores. It lives in rollout/,
not tasks/, because it runs what a rollout runs (a sandbox and the verifier); tasks/ imports no rollout module.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import orjson
from rich.console import Console
from rich.table import Table

from clawgym.artifacts import Transcript
from clawgym.errors import UserError
from clawgym.rollout.sandbox import SandboxConfig, SandboxError, open_sandbox
from clawgym.rollout.verifier import VerifierConfig, verify
from clawgym.tasks.source import UNEXPECTED
from clawgym.tasks.spec import find_task_dirs, load_task

NOOP_BUCKETS = ("0", "(0, 0.25]", "(0.25, 0.5]", "(0.5, 1]", "no code checks", "check error", "invalid")


@dataclass
class TaskReport:
    path: str
    id: str = ""
    category: str = ""
    verifier: str = ""
    weights: str = ""
    flags: list[str] = field(default_factory=list)
    noop_score: float | None = None
    noop_subscores: dict[str, float] = field(default_factory=dict)
    status: str = "ok"
    """ok | invalid (does not load) | check_error (its checks crash on the untouched workspace) | no_code"""
    error: str = ""
    seconds: float = 0.0

    @property
    def bucket(self) -> str:
        if self.status == "invalid":
            return "invalid"
        if self.status == "check_error":
            return "check error"
        if self.noop_score is None:
            return "no code checks"
        s = self.noop_score
        return "0" if s == 0 else "(0, 0.25]" if s <= 0.25 else "(0.25, 0.5]" if s <= 0.5 else "(0.5, 1]"


@dataclass
class ValidationReport:
    tasks: list[TaskReport]

    @property
    def n_invalid(self) -> int:
        return sum(t.status == "invalid" for t in self.tasks)

    def flag_counts(self) -> dict[str, int]:
        c = Counter(f for t in self.tasks for f in t.flags)
        c["offline (no network/browser/services/docker)"] = sum(
            t.status != "invalid" and not {"network", "browser", "services", "docker"} & set(t.flags) for t in self.tasks
        )
        return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    def noop_distribution(self) -> dict[str, int]:
        c = Counter(t.bucket for t in self.tasks)
        return {b: c.get(b, 0) for b in NOOP_BUCKETS}

    def to_json(self) -> bytes:
        return orjson.dumps(
            {"tasks": [asdict(t) for t in self.tasks], "flags": self.flag_counts(), "noop": self.noop_distribution()},
            option=orjson.OPT_INDENT_2,
        )


def validate_one(path: Path, sandbox: str = "local", sandbox_config: SandboxConfig | None = None,
                 verifier_config: VerifierConfig | None = None) -> TaskReport:
    t0 = time.monotonic()
    rep = TaskReport(path=str(path))
    try:
        task = load_task(path)
        flags = sorted(task.flags())
    except UserError as e:
        rep.status, rep.error, rep.seconds = "invalid", str(e), time.monotonic() - t0
        return rep
    except Exception as e:  # noqa: BLE001 - one malformed folder must not end the report
        rep.status, rep.error = "invalid", f"{UNEXPECTED}: {type(e).__name__}: {e}"
        rep.seconds = time.monotonic() - t0
        return rep
    rep.id, rep.category, rep.verifier = task.id, task.category, task.verifier_kind
    rep.weights = f"{task.code_weight:g}/{task.rubric_weight:g}"
    rep.flags = flags
    if not task.has_code_checks:
        rep.status = "no_code"
    else:
        try:
            with open_sandbox(sandbox, task.workspace_dir, sandbox_config or SandboxConfig()) as sb:
                result = verify(task, sb, transcript=Transcript(), final_message="", config=verifier_config or VerifierConfig())
            rep.noop_score = result.code_score
            rep.noop_subscores = {k.removeprefix("code/"): v for k, v in result.subscores.items() if k.startswith("code/")}
            if result.error:  # no judge here, so any error is the code checks'
                rep.status, rep.error = "check_error", result.error
        except SandboxError as e:
            rep.status, rep.error = "check_error", f"sandbox: {e}"
    if rep.noop_score and rep.noop_score > 0:
        rep.flags.append("noop>0")
    rep.seconds = time.monotonic() - t0
    return rep


def validate_tasks(path: str | Path, *, sandbox: str = "local", sandbox_config: SandboxConfig | None = None,
                   verifier_config: VerifierConfig | None = None, jobs: int = 2,
                   on_done: Callable[[TaskReport], None] | None = None) -> ValidationReport:
    """Validate every task folder under `path` (or `path` itself); never stops at a bad task."""
    dirs = find_task_dirs(path)
    reports: list[TaskReport | None] = [None] * len(dirs)

    def work(i: int) -> None:
        reports[i] = validate_one(dirs[i], sandbox, sandbox_config, verifier_config)
        if on_done:
            on_done(reports[i])

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        list(ex.map(work, range(len(dirs))))
    seen: dict[str, str] = {}
    for r in reports:
        if r.id and r.status != "invalid":
            if r.id in seen:
                r.status, r.error = "invalid", f"task id '{r.id}' is also used by {seen[r.id]}"
            seen.setdefault(r.id, r.path)
    return ValidationReport([r for r in reports if r is not None])


def print_report(report: ValidationReport, console: Console, *, show_all: bool = True) -> None:
    """The per-task table (or only tasks with problems), then counts by flag and no-op scores."""
    table = Table(title=f"{len(report.tasks)} task(s)", show_lines=False)
    for col in ("task", "category", "verifier", "code/rubric", "flags", "no-op", "status"):
        table.add_column(col, overflow="fold")
    for t in report.tasks:
        if not show_all and t.status == "ok" and not t.noop_score:
            continue
        noop = "-" if t.noop_score is None else f"{t.noop_score:.3f}"
        status = t.status if not t.error else f"{t.status}: {t.error[:160]}"
        style = "red" if t.status == "invalid" else "yellow" if t.status == "check_error" or (t.noop_score or 0) > 0 else None
        table.add_row(t.id or Path(t.path).name, t.category, t.verifier, t.weights, ", ".join(t.flags), noop, status, style=style)
    console.print(table)
    flags = Table(title="tasks by flag")
    flags.add_column("flag")
    flags.add_column("tasks", justify="right")
    for k, v in report.flag_counts().items():
        flags.add_row(k, str(v))
    noop = Table(title="no-op score (verifier on the untouched workspace)")
    noop.add_column("score")
    noop.add_column("tasks", justify="right")
    for k, v in report.noop_distribution().items():
        noop.add_row(k, str(v))
    console.print(flags)
    console.print(noop)
