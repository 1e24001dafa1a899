"""Evaluation reports: Pass@1 per task, category and, through several harnesses, per harness."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from clawgym import artifacts as A
from clawgym.run import metrics as M
from clawgym.run.eval import pass_table, report_from_rollouts


def rollout(task: str, category: str, harness: str, reward: float | None, i: int = 0) -> A.RolloutRecord:
    return A.RolloutRecord(rollout_id=f"{task}.{harness}.{i}", task_id=task, harness=harness, group_id=f"{task}.{harness}",
                           sample_index=i, status="ok" if reward is not None else "infra_error", reward=reward,
                           n_calls=1, wall_time_s=1.0, policy_version=0, category=category)


MIXED = [rollout("t1", "count", "agentloop", 1.0), rollout("t2", "value", "agentloop", 1.0),
         rollout("t1", "count", "codex", 0.0), rollout("t2", "value", "codex", 1.0), rollout("t2", "value", "codex", None, 1)]


def test_a_mixed_harness_evaluation_reports_each_harness_over_its_own_rollouts() -> None:
    report = report_from_rollouts(MIXED)
    # pooled: t1 = mean(1, 0) = 0.5, t2 = mean(1, 1) = 1.0
    assert report.overall == pytest.approx(0.75) and report.per_category() == {"count": 0.5, "value": 1.0}
    assert report.excluded == 1 and sorted(report.per_harness) == ["agentloop", "codex"]
    loop, codex = report.per_harness["agentloop"], report.per_harness["codex"]
    assert (loop.overall, loop.excluded) == (1.0, 0)
    assert (codex.overall, codex.per_category(), codex.excluded) == (0.5, {"count": 0.0, "value": 1.0}, 1)
    m = report.metrics()
    assert m["pass@1"] == pytest.approx(0.75) and m["codex/pass@1"] == 0.5 and m["codex/pass@1/count"] == 0.0
    assert m["agentloop/pass@1"] == 1.0 and m["codex/excluded"] == 1.0
    # eval.json's document gives back the same figures
    assert M.eval_figures(report.to_json()) == m


def test_a_single_harness_evaluation_has_no_per_harness_rows() -> None:
    report = report_from_rollouts([r for r in MIXED if r.harness == "codex"])
    assert report.per_harness == {} and "per_harness" not in report.to_json()
    assert not any(k.startswith("codex/") for k in report.metrics())
    rows = [line for line in report.markdown().splitlines() if line.startswith("| codex")]
    assert rows == ["| codex | 0.0 | 100.0 | 50.0 |"]


def test_the_tables_show_a_row_per_harness_and_the_pooled_row() -> None:
    report = report_from_rollouts(MIXED)
    lines = report.markdown().splitlines()
    assert lines[:5] == ["| harness | count | value | overall |", "|---|---|---|---|", "| agentloop | 100.0 | 100.0 | 100.0 |",
                         "| codex | 0.0 | 100.0 | 50.0 |", "| all (agentloop, codex) | 50.0 | 100.0 | 75.0 |"]
    buf = io.StringIO()
    report.print(Console(file=buf, width=120))
    printed = buf.getvalue()
    assert "agentloop" in printed and "all (agentloop, codex)" in printed and "1 rollout(s) excluded" in printed
    # the run's table: each policy's row, then its harnesses' rows
    table = pass_table({"SFT": report.to_json(), "base": report_from_rollouts(MIXED[:2]).to_json()}).splitlines()
    assert table[2:6] == ["| SFT | 50.0 | 100.0 | 75.0 |", "| SFT · agentloop | 100.0 | 100.0 | 100.0 |",
                          "| SFT · codex | 0.0 | 100.0 | 50.0 |", "| base | 100.0 | 100.0 | 100.0 |"]


def test_inspect_shows_a_mixed_evaluations_pass_at_1_per_harness(tmp_path) -> None:
    import orjson

    from clawgym.run.inspection import inspect_run
    from clawgym.layout import RunLayout

    edir = RunLayout(tmp_path).eval(1)
    edir.path.mkdir(parents=True)
    edir.eval_json.write_bytes(orjson.dumps(report_from_rollouts(MIXED).to_json()))
    buf = io.StringIO()
    inspect_run(tmp_path, Console(file=buf, width=200))
    lines = buf.getvalue().splitlines()
    head, row = next(line for line in lines if line.startswith("┃")), next(line for line in lines if line.startswith("│"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    titles = [c.strip() for c in head.strip("┃").split("┃")]
    assert titles == ["step", "eval Pass@1 %", "eval agentloop %", "eval codex %"] and cells == ["1", "75.0", "100.0", "50.0"]
