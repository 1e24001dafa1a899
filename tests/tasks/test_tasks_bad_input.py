"""Task import and validation answer bad input with one line naming the file and field, skip that
task, and go on with the rest of the set (issue 15 items 6-8; docs/reliability.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clawgym.cli import app
from clawgym.errors import UserError
from clawgym.rollout.sandbox import SandboxConfig
from clawgym.tasks.importers import import_tasks
from clawgym.rollout.validate import validate_tasks
from test_tasks import PINCH, _clawgym_src, make_task

LATIN1 = "Résumé: écrire 42.\n".encode("latin-1")  # é is 0xe9: not UTF-8


def _one_line(reason: str) -> None:
    assert "\n" not in reason and "Traceback" not in reason and not reason.startswith("unexpected error"), reason


def _pinch_set(tmp_path: Path, bad: str | bytes) -> Path:
    """A PinchBench checkout with a good task (task_good) and `bad` as tasks/task_bad.md."""
    src = tmp_path / "pb"
    (src / "tasks").mkdir(parents=True)
    (src / "assets").mkdir()
    (src / "assets" / "data.csv").write_text("a,b\n1,2\n")
    (src / "tasks" / "task_good.md").write_text(PINCH.replace("id: task_demo", "id: task_good"))
    data = bad.encode() if isinstance(bad, str) else bad
    (src / "tasks" / "task_bad.md").write_bytes(data)
    return src


@pytest.mark.parametrize(
    "bad, reason",
    [
        (PINCH.encode().replace(b"Uppercases", b"Upp\xe9rcases"), "task_bad.md: not UTF-8 text (byte 0xe9"),
        (PINCH.replace("timeout_seconds: 90", "timeout_seconds: ninety"), "task_bad.md: field 'timeout_seconds' must be a number, got 'ninety'"),
        (PINCH.replace("timeout_seconds: 90", "timeout_seconds: .nan"), "field 'timeout_seconds' must be a positive finite number"),
        (PINCH.replace("automated: 0.6", "automated: lots"), "task_bad.md: field 'grading_weights.automated' must be a number, got 'lots'"),
        (PINCH.replace("  automated: 0.6\n  llm_judge: 0.4", "  - 0.6\n  - 0.4"), "field 'grading_weights' must be a mapping, got list"),
        (PINCH.replace("workspace_files:\n", "workspace_files: notes.txt\nx:\n"), "field 'workspace_files' must be a list"),
        (PINCH.replace("grading_type: hybrid", "grading_type: hybrid\nprerequisites: 5"), "field 'prerequisites' must be a list, got int"),
        (PINCH.replace("grading_type: hybrid", "grading_type: hybrid\nsessions: {a: 1}"), "field 'sessions' must be a list, got dict"),
    ],
)
def test_pinchbench_bad_field_skips_only_that_task(tmp_path: Path, bad: str | bytes, reason: str) -> None:
    report = import_tasks("pinchbench", _pinch_set(tmp_path, bad), tmp_path / "out")
    assert [t.id for t in report.imported] == ["task_good"]
    assert [name for name, _ in report.skipped] == ["task_bad.md"] and reason in report.skipped[0][1], report.skipped
    _one_line(report.skipped[0][1])


@pytest.mark.parametrize(
    "manifest, problem",
    [
        ("categories: [unclosed\n", "not valid YAML"),
        ("- just\n- a list\n", "the document must be a mapping, got list"),
        ("categories:\n  - task_good\n", "field 'categories' must be a mapping, got list"),
        ("categories:\n  coding: task_good\n", "field 'categories.coding' must be a list, got str"),
    ],
)
def test_pinchbench_bad_manifest_is_noted_and_every_task_imports(tmp_path: Path, manifest: str, problem: str) -> None:
    src = _pinch_set(tmp_path, PINCH.replace("id: task_demo", "id: task_bad"))
    (src / "tasks" / "manifest.yaml").write_text(manifest)
    report = import_tasks("pinchbench", src, tmp_path / "out")
    assert sorted(t.id for t in report.imported) == ["task_bad", "task_good"] and report.skipped == []
    assert report.imported[0].category == "coding"  # the front matter's, since the manifest could not be read
    ((where, note),) = report.notes
    assert where.endswith("manifest.yaml") and problem in note and "front matter" in note
    _one_line(note)


def _clawgym_set(tmp_path: Path, entry: bytes) -> Path:
    """The good ClawGym task_0007 plus task_0008 whose data_entry.json holds `entry`."""
    src = _clawgym_src(tmp_path)
    bad = src / "task_0008"
    (bad / "reward").mkdir(parents=True)
    (bad / "reward" / "check.py").write_text("print('{}')\n")
    (bad / "data_entry.json").write_bytes(entry)
    return src


def _entry(**fields: object) -> bytes:
    return json.dumps({"task_id": "task_0008", "user_query": "Do it.", **fields}).encode()


@pytest.mark.parametrize(
    "entry, reason",
    [
        (json.dumps([{"task_id": "task_0008"}]).encode(), "data_entry.json: must be a JSON object (task_id, user_query, metadata), got list"),
        (b'{"task_id": "task_0008", "user_query": "R\xe9sum\xe9"}', "data_entry.json: not UTF-8 text (byte 0xe9"),
        (_entry(metadata="Analysis"), "data_entry.json: field 'metadata' must be a mapping, got str"),
        (_entry(rules=[{"name": "tone", "scores": {"good": "fine", "bad": "no"}}]), "data_entry.json: rules[0] field 'scores': key 'good' must be a number"),
        (_entry(rules=[{"name": "tone", "scores": ["bad", "ok", "great"]}]), "data_entry.json: rules[0] field 'scores' (score -> text) must be a mapping, got list"),
        (_entry(rules=[{"name": "tone", "scores": {"5": "too much"}}]), "rules[0] field 'scores': keys must be scores in [0, 1]"),
        (_entry(rules="be nice"), "field 'rules' must be a list, got str"),
        (_entry(task_id=7), "field 'task_id': task id 7 must match"),
    ],
)
def test_clawgym_bad_entry_skips_only_that_task(tmp_path: Path, entry: bytes, reason: str) -> None:
    report = import_tasks("clawgym", _clawgym_set(tmp_path, entry), tmp_path / "out")
    assert [t.id for t in report.imported] == ["task_0007"]
    assert [n for n, _ in report.skipped] == ["task_0008"] and reason in report.skipped[0][1], report.skipped
    _one_line(report.skipped[0][1])


def _harbor_set(tmp_path: Path) -> Path:
    for name in ("good", "bad"):
        d = tmp_path / "hb" / name
        (d / "tests").mkdir(parents=True)
        (d / "task.toml").write_text('version = "1.0"\n[environment]\nallow_internet = false\n')
        (d / "instruction.md").write_text("Create /app/hello.txt\n")
        (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return tmp_path / "hb"


@pytest.mark.parametrize(
    "part, data, reason",
    [
        ("instruction.md", LATIN1, "bad/instruction.md: not UTF-8 text"),
        ("task.toml", b'version = "1.0"\n# caf\xe9\n', "bad/task.toml: not UTF-8 text"),
        ("task.toml", b'metadata = "easy"\n', "bad/task.toml: [metadata] must be a mapping, got str"),
        ("task.toml", b'[metadata]\nwhen = 2024-01-01\n', "bad: task.toml: metadata.when: cannot write date to TOML"),
    ],
)
def test_harbor_bad_part_skips_only_that_task(tmp_path: Path, part: str, data: bytes, reason: str) -> None:
    src = _harbor_set(tmp_path)
    (src / "bad" / part).write_bytes(data)
    report = import_tasks("harbor", src, tmp_path / "out")
    assert [t.id for t in report.imported] == ["good"]
    assert reason in report.skipped[0][1], report.skipped
    _one_line(report.skipped[0][1])


def test_destination_that_is_a_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("my notes\n")
    with pytest.raises(UserError, match="out: exists and is not a folder"):
        import_tasks("pinchbench", _pinch_set(tmp_path, PINCH), tmp_path / "out")
    assert (tmp_path / "out").read_text() == "my notes\n"  # nothing already written is lost
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", "tasks", "import", "--from", "pinchbench", str(tmp_path / "pb"),
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "exists and is not a folder" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("part", ["instruction.md", "tests/rubric.md", "task.toml"])
def test_validate_reports_non_utf8_and_goes_on(tmp_path: Path, part: str) -> None:
    make_task(tmp_path, "good")
    bad = make_task(tmp_path, "bad", rubric="Is it good?")
    (bad / part).write_bytes(LATIN1)
    rep = {Path(r.path).name: r for r in validate_tasks(tmp_path, sandbox_config=SandboxConfig(network="blackhole")).tasks}
    assert rep["good"].status == "ok" and rep["bad"].status == "invalid"
    assert f"bad/{part}: not UTF-8 text (byte 0xe9" in rep["bad"].error
    _one_line(rep["bad"].error)
    r = CliRunner().invoke(app, ["tasks", "validate", str(tmp_path), "--json", str(tmp_path / "v.json")])
    assert r.exit_code == 1 and r.exception.__class__ is SystemExit and "invalid" in r.output
    assert sorted(t["status"] for t in json.loads((tmp_path / "v.json").read_text())["tasks"]) == ["invalid", "ok"]


# ---------------------------------------------------------------------------------------------
# Item 7: links out of the source tree
# ---------------------------------------------------------------------------------------------


def _host_folder(tmp_path: Path) -> Path:
    """Stands for a host folder such as /var/log: outside the PinchBench checkout."""
    host = tmp_path / "host" / "log"
    host.mkdir(parents=True)
    (host / "syslog").write_text("host secret\n")
    return host


LOG_TASK = PINCH.replace("  - source: data.csv\n    dest: data.csv", "  - source: logs/syslog\n    dest: syslog").replace("id: task_demo", "id: task_logs")


def test_asset_folder_linked_outside_the_source_is_refused(tmp_path: Path) -> None:
    src = _pinch_set(tmp_path, LOG_TASK)
    os.symlink(_host_folder(tmp_path), src / "assets" / "logs")
    report = import_tasks("pinchbench", src, tmp_path / "out")
    assert [t.id for t in report.imported] == ["task_good"]
    ((name, reason),) = report.skipped
    assert name == "task_bad.md" and "asset 'logs/syslog'" in reason and "links that leave the source tree are refused" in reason
    _one_line(reason)
    assert not [p for p in (tmp_path / "out").rglob("syslog")]  # no host file reached a workspace
    # A whole assets folder linked out: refused too, unless the user names it with --assets.
    (src / "assets" / "logs").unlink()
    os.rename(src / "assets", tmp_path / "host" / "assets")
    os.symlink(tmp_path / "host" / "assets", src / "assets")
    report = import_tasks("pinchbench", src, tmp_path / "out2")
    assert report.imported == [] and all("name the assets root with --assets" in r for _, r in report.skipped)


def test_assets_root_named_explicitly_may_lie_outside(tmp_path: Path) -> None:
    src = _pinch_set(tmp_path, LOG_TASK)
    outside = tmp_path / "elsewhere" / "assets"
    (outside / "logs").mkdir(parents=True)
    (outside / "logs" / "syslog").write_text("a log the user chose\n")
    (outside / "data.csv").write_text("a,b\n")
    r = CliRunner().invoke(app, ["tasks", "import", "--from", "pinchbench", str(src), str(tmp_path / "out"), "--assets", str(outside)])
    assert r.exit_code == 0 and "imported 2 task(s)" in r.output, r.output
    assert (tmp_path / "out" / "task_logs" / "workspace" / "syslog").read_text() == "a log the user chose\n"
    # Inside the named root, a link leading out of it is still refused.
    (outside / "logs" / "syslog").unlink()
    os.symlink(_host_folder(tmp_path) / "syslog", outside / "logs" / "syslog")
    report = import_tasks("pinchbench", src, tmp_path / "out2", assets=outside)
    assert [t.id for t in report.imported] == ["task_good"] and "leads outside" in report.skipped[0][1]
    with pytest.raises(UserError, match="--assets applies to --from pinchbench only"):
        import_tasks("clawgym", src, tmp_path / "out3", assets=outside)


# ---------------------------------------------------------------------------------------------
# Item 8: two tasks with one id
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("force", [False, True])
def test_same_id_twice_keeps_the_first_and_says_so(tmp_path: Path, force: bool) -> None:
    src = _pinch_set(tmp_path, PINCH.replace("id: task_demo", "id: task_good").replace("HELLO", "WORLD"))
    report = import_tasks("pinchbench", src, tmp_path / "out", force=force)
    assert [t.id for t in report.imported] == ["task_good"]
    ((name, reason),) = report.skipped
    # task_bad.md sorts first, so it is the one kept; task_good.md is named as the one skipped.
    assert name == "task_good.md" and "task id 'task_good' is also the id of task_bad.md, imported first" in reason
    assert "WORLD" in (tmp_path / "out" / "task_good" / "instruction.md").read_text()
