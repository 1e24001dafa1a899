"""Tasks: the native folder format, path safety, the three importers, validation and the CLI.

Fixtures are written here; the shared samples in ../shared/tasks/ are used when present."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clawgym.artifacts import Transcript, TranscriptMessage
from clawgym.cli import app
from clawgym.errors import UserError
from clawgym.rollout.sandbox import SandboxConfig, open_sandbox
from clawgym.rollout.verifier import verify
from clawgym.tasks import load_task, load_tasks
from clawgym.tasks.importers import import_tasks
from clawgym.tasks.pinchbench import split_sections
from clawgym.tasks.rubric import parse_rubric
from clawgym.tasks.spec import safe_relpath
from clawgym.rollout.validate import validate_tasks
from clawgym.tasks.writer import dump_toml

SHARED = Path(__file__).resolve().parents[3] / "shared" / "tasks"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared task samples not present at {SHARED}")

CHECK = '''import json, sys
from pathlib import Path
ws = Path(sys.argv[1])
out = ws / "answer.txt"
print(json.dumps({"exists": float(out.is_file()), "correct": float(out.is_file() and out.read_text().strip() == "42")}))
'''


def make_task(root: Path, name: str = "t1", *, toml: str = "", rubric: str | None = None, check: str | None = CHECK,
              files: dict[str, str] | None = None) -> Path:
    d = root / name
    (d / "workspace").mkdir(parents=True)
    (d / "task.toml").write_text(toml or '[metadata]\ncategory = "demo"\n[agent]\ntimeout_sec = 30\n')
    (d / "instruction.md").write_text("Write 42 to answer.txt.\n")
    for rel, text in (files or {"input.txt": "the answer is 42\n"}).items():
        (d / "workspace" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "workspace" / rel).write_text(text)
    if check is not None or rubric is not None:
        (d / "tests").mkdir()
    if check is not None:
        (d / "tests" / "check.py").write_text(check)
    if rubric is not None:
        (d / "tests" / "rubric.md").write_text(rubric)
    return d


def test_load_native_task(tmp_path: Path) -> None:
    d = make_task(tmp_path, rubric="### Criterion 1: Clarity (Weight: 40%)\nIs it clear?\n**Score 1.0**: yes\n**Score 0.0**: no\n")
    t = load_task(d)
    assert (t.id, t.category, t.agent_timeout_s, t.verifier_kind) == ("t1", "demo", 30.0, "check")
    assert (t.code_weight, t.rubric_weight) == pytest.approx((0.7, 0.3))  # both present: the paper's default
    assert t.rubric.criteria[0].name == "Clarity" and t.rubric.criteria[0].weight == pytest.approx(0.4)
    assert t.rubric.criteria[0].anchors == (0.0, 1.0)
    assert t.flags() == {"judge"}
    ws = t.materialize(tmp_path / "ws")
    assert (ws / "input.txt").read_text() == "the answer is 42\n"
    assert not (ws / "check.py").exists()  # hidden tests never reach the workspace


@pytest.mark.parametrize(
    "toml, problem",
    [
        ("[claw]\nneeds = ['teleport']\n", "field 'needs' has unknown value"),
        ("[verifier]\nkind = 'magic'\n", "field 'kind'"),
        ("[verifier.weights]\nrubric = 1.0\n", "'rubric' is 1.0 but the task has no tests/rubric.md"),
        ("[agent]\ntimeout_sec = -5\n", "[agent] timeout_sec must be positive"),
        ("[agent]\ntimeout_sec = 'soon'\n", "field 'timeout_sec' must be a number"),
        ("[metadata]\nid = 'bad id!'\n", "field 'id'"),
        ("[claw]\nneedz = []\n", "unknown field(s) ['needz']"),
        ("this is = not toml [", "not valid TOML"),
    ],
)
def test_invalid_task_names_folder_and_field(tmp_path: Path, toml: str, problem: str) -> None:
    d = make_task(tmp_path, toml=toml)
    with pytest.raises(UserError) as e:
        load_task(d)
    assert problem in str(e.value) and str(d) in str(e.value)


def test_missing_parts(tmp_path: Path) -> None:
    d = make_task(tmp_path)
    (d / "instruction.md").unlink()
    with pytest.raises(UserError, match="missing instruction.md"):
        load_task(d)
    d2 = make_task(tmp_path, "t2", check=None)
    (d2 / "task.toml").write_text("[verifier]\nkind = 'check'\n")
    with pytest.raises(UserError, match="needs tests/check.py"):
        load_task(d2)
    with pytest.raises(UserError, match="holds no task folders"):
        load_tasks(tmp_path / "t2" / "workspace")


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", "a/../../b", "~/x", "C:/x", ""])
def test_safe_relpath_rejects_traversal(bad: str) -> None:
    with pytest.raises(UserError):
        safe_relpath(bad, "where")
    assert str(safe_relpath("a/b.txt", "where")) == "a/b.txt"


def test_symlink_leaving_task_is_rejected(tmp_path: Path) -> None:
    d = make_task(tmp_path)
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path / "secret", d / "workspace" / "link")
    with pytest.raises(UserError, match="symlink 'workspace/link' points outside"):
        load_task(d)
    (d / "workspace" / "link").unlink()
    os.symlink("input.txt", d / "workspace" / "inner")  # inside the folder: fine
    assert load_task(d).id == "t1"


def test_duplicate_ids(tmp_path: Path) -> None:
    make_task(tmp_path, "a", toml="[metadata]\nid = 'same'\n")
    make_task(tmp_path, "b", toml="[metadata]\nid = 'same'\n")
    with pytest.raises(UserError, match="task id 'same' is also used"):
        load_tasks(tmp_path)


def test_rubric_parsing() -> None:
    r = parse_rubric("Context first.\n\n### Accuracy\nNumbers right.\nFiles: out.md, `b.md`\n- Score 1: all\n- Score 0.5: some\n", "r")
    assert r.preamble == "Context first." and r.criteria[0].files == ("out.md", "b.md")
    assert r.criteria[0].anchors == (0.5, 1.0)
    assert "criterion_1: Accuracy" in r.render() and "Allowed scores: 0.5, 1" in r.render()
    whole = parse_rubric("Just judge the tone.", "r")
    assert whole.criteria[0].name == "overall" and whole.criteria[0].anchors == (0.0, 0.25, 0.5, 0.75, 1.0)
    with pytest.raises(UserError, match="empty"):
        parse_rubric("  \n", "r")
    with pytest.raises(UserError, match="outside \\[0, 1\\]"):
        parse_rubric("### A\n**Score 5**: too much\n", "r")


def test_dump_toml_roundtrip() -> None:
    doc = {"version": "1.0", "metadata": {"id": "x", "tags": ["a", "b"], "q": 'say "hi"\nnow'},
           "verifier": {"timeout_sec": 1.5, "weights": {"code": 0.7}}, "claw": {"sessions": [{"name": "s1", "new_session": True}]}}
    assert tomllib.loads(dump_toml(doc)) == doc


# ---------------------------------------------------------------------------------------------
# Importers on fixtures
# ---------------------------------------------------------------------------------------------

PINCH = '''---
id: task_demo
name: Demo
category: coding
grading_type: hybrid
timeout_seconds: 90
grading_weights:
  automated: 0.6
  llm_judge: 0.4
workspace_files:
  - path: notes/input.txt
    content: "hello"
  - source: data.csv
    dest: data.csv
---

## Prompt

Write `out.txt` containing HELLO. Format:

```
## Not a section
```

## Expected Behavior

Uppercases the note.

## Grading Criteria

- [ ] out.txt exists

## Automated Checks

```python
def grade(transcript: list, workspace_path: str) -> dict:
    from pathlib import Path
    p = Path(workspace_path) / "out.txt"
    return {"exists": 1.0 if p.exists() else 0.0, "upper": 1.0 if p.exists() and p.read_text().strip() == "HELLO" else 0.0,
            "saw_transcript": 1.0 if len(transcript) > 0 else 0.0}
```

## LLM Judge Rubric

### Criterion 1: Quality (Weight: 100%)
**Score 1.0**: perfect
**Score 0.0**: bad
'''


def _pinch_src(tmp_path: Path, text: str = PINCH) -> Path:
    src = tmp_path / "pb"
    (src / "tasks").mkdir(parents=True)
    (src / "assets").mkdir()
    (src / "assets" / "data.csv").write_text("a,b\n1,2\n")
    (src / "tasks" / "task_demo.md").write_text(text)
    return src


def test_split_sections_ignores_fenced_headings() -> None:
    s = split_sections(PINCH.split("---\n", 2)[2])
    assert "Not a section" not in s and "## Not a section" in s["Prompt"]


def test_pinchbench_import_reproduces_scoring(tmp_path: Path) -> None:
    report = import_tasks("pinchbench", _pinch_src(tmp_path), tmp_path / "out")
    assert report.skipped == [] and len(report.imported) == 1
    t = report.imported[0]
    assert (t.id, t.category, t.agent_timeout_s, t.verifier_kind) == ("task_demo", "coding", 90.0, "check")
    assert (t.code_weight, t.rubric_weight) == pytest.approx((0.6, 0.4))
    assert "Expected behavior" in t.rubric.preamble and t.rubric.criteria[0].name == "Quality"
    assert (t.workspace_dir / "notes" / "input.txt").read_text() == "hello" and (t.workspace_dir / "data.csv").is_file()
    with open_sandbox("local", t.workspace_dir, SandboxConfig(network="blackhole")) as sb:
        assert verify(t, sb).code_score == 0.0
        (sb.workspace / "out.txt").write_text("HELLO")
        r = verify(t, sb, transcript=Transcript(messages=[TranscriptMessage("user", "go")]))
    # PinchBench's rule: the unweighted mean of grade()'s criteria, with the transcript passed in.
    assert r.code_score == pytest.approx(1.0) and r.subscores["code/saw_transcript"] == 1.0


@pytest.mark.parametrize(
    "edit, reason",
    [
        (("path: notes/input.txt", "path: ../../evil.txt"), "leaves its folder"),
        (("dest: data.csv", "dest: /tmp/evil.csv"), "absolute path"),
        (("source: data.csv", "source: ../../../etc/passwd"), "leaves its folder"),
        (("source: data.csv", "source: missing.csv"), "not found"),
        (("grading_type: hybrid", "grading_type: vibes"), "grading_type"),
    ],
)
def test_pinchbench_bad_task_is_skipped(tmp_path: Path, edit: tuple[str, str], reason: str) -> None:
    report = import_tasks("pinchbench", _pinch_src(tmp_path, PINCH.replace(*edit)), tmp_path / "out")
    assert report.imported == [] and reason in report.skipped[0][1]
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil.csv").exists()
    assert not any((tmp_path / "out").iterdir()) if (tmp_path / "out").exists() else True


def _clawgym_src(tmp_path: Path, rules: list | None = None) -> Path:
    d = tmp_path / "cg" / "task_0007"
    (d / "input_files" / "input").mkdir(parents=True)
    (d / "reward").mkdir()
    (d / "input_files" / "input" / "n.txt").write_text("3\n")
    meta = {"category": "Analysis", "grading_type": "automated"}
    entry = {"task_id": "task_0007", "user_query": "Write input/n.txt squared to output/sq.txt.", "metadata": meta}
    if rules is not None:
        entry["rules"] = rules
    (d / "data_entry.json").write_text(json.dumps(entry))
    (d / "reward" / "check.py").write_text(
        "import json, sys\nfrom pathlib import Path\nws = Path(sys.argv[1] if len(sys.argv) > 1 else '/root/.openclaw/workspace')\n"
        "o = ws / 'output' / 'sq.txt'\nprint(json.dumps({'exists': o.is_file(), 'value': o.is_file() and o.read_text().strip() == '9'}, indent=2))\n"
    )
    (d / "reward" / "reward.sh").write_text("#!/usr/bin/env bash\n")
    return tmp_path / "cg"


def test_clawgym_import_reproduces_scoring(tmp_path: Path) -> None:
    rules = [{"name": "tone", "file_path": "output/sq.txt", "scores": {"0": "bad", "0.5": "ok", "1": "great"}}]
    report = import_tasks("clawgym", _clawgym_src(tmp_path, rules), tmp_path / "out")
    t = report.imported[0]
    assert (t.id, t.category, t.code_weight, t.rubric_weight) == ("task_0007", "Analysis", pytest.approx(0.7), pytest.approx(0.3))
    assert t.rubric.criteria[0].files == ("output/sq.txt",) and t.rubric.criteria[0].anchors == (0.0, 0.5, 1.0)
    assert (t.workspace_dir / "input" / "n.txt").is_file() and (t.tests_dir / "check.py").is_file()
    with open_sandbox("local", t.workspace_dir, SandboxConfig(network="blackhole")) as sb:
        (sb.workspace / "output").mkdir()
        (sb.workspace / "output" / "sq.txt").write_text("8")
        r = verify(t, sb)
    assert r.code_score == pytest.approx(0.5)  # ClawGym: the mean of check.py's dict (booleans count 0/1)
    no_rules = import_tasks("clawgym", _clawgym_src(tmp_path / "b"), tmp_path / "out2").imported[0]
    assert (no_rules.code_weight, no_rules.rubric, no_rules.flags()) == (1.0, None, set())


def test_harbor_import(tmp_path: Path) -> None:
    d = tmp_path / "hb" / "hello"
    (d / "tests").mkdir(parents=True)
    (d / "environment").mkdir()
    (d / "task.toml").write_text('version = "1.0"\n[metadata]\ndifficulty = "easy"\n[agent]\ntimeout_sec = 60.0\n[environment]\nallow_internet = false\n')
    (d / "instruction.md").write_text("Create /app/hello.txt\n")
    (d / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    t = import_tasks("harbor", tmp_path / "hb", tmp_path / "out").imported[0]
    assert (t.id, t.verifier_kind, t.agent_timeout_s, t.workdir) == ("hello", "harbor", 60.0, "/app")
    assert t.flags() == {"docker"} and (t.path / "environment" / "Dockerfile").is_file()
    assert t.metadata["difficulty"] == "easy"


def test_import_refuses_to_overwrite(tmp_path: Path) -> None:
    src = _pinch_src(tmp_path)
    import_tasks("pinchbench", src, tmp_path / "out")
    again = import_tasks("pinchbench", src, tmp_path / "out")
    assert "already exists" in again.skipped[0][1]
    assert len(import_tasks("pinchbench", src, tmp_path / "out", force=True).imported) == 1
    with pytest.raises(UserError, match="unknown task source"):
        import_tasks("swebench", src, tmp_path / "out")


def test_validate_reports_noop_and_flags(tmp_path: Path) -> None:
    make_task(tmp_path, "zero")
    make_task(tmp_path, "free", files={"answer.txt": "7"})  # 'exists' already passes: free credit
    make_task(tmp_path, "crash", check="raise SystemExit(3)")
    make_task(tmp_path, "judged", check=None, rubric="Is it good?")
    make_task(tmp_path, "broken", toml="[verifier]\nkind = 'nope'\n")
    rep = {r.id or Path(r.path).name: r for r in validate_tasks(tmp_path, sandbox_config=SandboxConfig(network="blackhole")).tasks}
    assert rep["zero"].noop_score == 0.0 and rep["zero"].status == "ok"
    assert rep["free"].noop_score == pytest.approx(0.5) and "noop>0" in rep["free"].flags
    assert rep["crash"].status == "check_error" and "exited 3" in rep["crash"].error
    assert rep["judged"].noop_score is None and rep["judged"].flags == ["judge"]
    assert rep["broken"].status == "invalid" and "field 'kind'" in rep["broken"].error
    for name in ("broken", "judged", "free", "zero"):  # the crashing task alone still fails the command
        import shutil

        shutil.rmtree(tmp_path / name)
    r = CliRunner().invoke(app, ["tasks", "validate", str(tmp_path), "--network", "bwrap"])
    assert r.exit_code == 1 and "0 task(s) invalid, 1 whose checks crash on the untouched workspace" in r.output, r.output


def test_cli_import_and_validate(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["tasks", "import", "--from", "pinchbench", str(_pinch_src(tmp_path)), str(tmp_path / "out")])
    assert r.exit_code == 0 and "imported 1 task(s)" in r.output
    r = runner.invoke(app, ["tasks", "validate", str(tmp_path / "out"), "--all", "--json", str(tmp_path / "v.json")])
    assert r.exit_code == 0 and "task_demo" in r.output and "tasks by flag" in r.output
    assert json.loads((tmp_path / "v.json").read_text())["noop"]["0"] == 1
    make_task(tmp_path / "out", "broken", toml="[verifier]\nkind = 'nope'\n")
    assert runner.invoke(app, ["tasks", "validate", str(tmp_path / "out")]).exit_code == 1
    # verifiers run task code: no file isolation only when asked for by name, as for a rollout
    r = runner.invoke(app, ["tasks", "validate", str(tmp_path / "out"), "--network", "blackhole"])
    assert isinstance(r.exception, UserError) and "choose --sandbox local-unisolated" in str(r.exception)
    r = runner.invoke(app, ["tasks", "validate", str(tmp_path / "out"), "--sandbox", "local-unisolated", "--network", "blackhole"])
    assert r.exit_code == 1 and "broken" in r.output and r.exception.__class__ is SystemExit
    for cmd in (["tasks", "import", "--help"], ["tasks", "validate", "--help"]):
        assert "Example:" in runner.invoke(app, cmd).output


# ---------------------------------------------------------------------------------------------
# The shared samples
# ---------------------------------------------------------------------------------------------


@needs_shared
def test_shared_samples_import(tmp_path: Path) -> None:
    pb = import_tasks("pinchbench", SHARED / "pinchbench", tmp_path / "pb")
    assert len(pb.imported) >= 100 and len(pb.skipped) <= 3, pb.skipped
    cg = import_tasks("clawgym", SHARED / "clawgym-bench", tmp_path / "cg")
    assert len(cg.imported) == len([p for p in (SHARED / "clawgym-bench").iterdir() if (p / "data_entry.json").is_file()]) and not cg.skipped
    hb = import_tasks("harbor", SHARED / "harbor", tmp_path / "hb")
    assert len(hb.imported) >= 1 and all(t.verifier_kind == "harbor" for t in hb.imported)
    by_id = {t.id: t for t in pb.imported}
    assert by_id["task_csv_iris_classify"].code_weight == pytest.approx(0.6)
    assert "network" in by_id["task_weather"].flags() if "task_weather" in by_id else True


@needs_shared
@pytest.mark.slow
def test_shared_samples_validate(tmp_path: Path) -> None:
    import_tasks("clawgym", SHARED / "clawgym-bench", tmp_path / "cg")
    import_tasks("pinchbench", SHARED / "pinchbench", tmp_path / "pb")
    for sub in ("cg", "pb"):
        rep = validate_tasks(tmp_path / sub, sandbox_config=SandboxConfig(network="blackhole"), jobs=2)
        assert rep.n_invalid == 0
        dist = rep.noop_distribution()
        assert dist["check error"] == 0 and dist["0"] >= 0.8 * len(rep.tasks) - dist["no code checks"], dist
