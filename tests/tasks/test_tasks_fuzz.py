"""Task importers and `tasks validate`, fuzzed with hypothesis (like the proxy routes in
tests/test_security.py): each example is a task set of one good task and one malformed one.

For every importer and for validation: no exception escapes (a set-level problem is a UserError),
no skip reason is the importer's "unexpected error" safety net (every bad input has its own check
and one-line reason), the good task still imports or validates, and nothing outside the
destination is written (the source tree is byte-for-byte unchanged, no temp folder is left, and
the hostile paths the fuzzer offers never appear)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawgym.errors import UserError
from clawgym.rollout.sandbox import SandboxConfig
from clawgym.tasks.importers import import_tasks
from clawgym.tasks.source import UNEXPECTED
from clawgym.rollout.validate import validate_tasks
from test_tasks import PINCH

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Paths a malformed task may name: each would land outside the destination if followed.
HOSTILE = ["../escape/x.txt", "../../escape/y.txt", "/tmp/clawgym-fuzz-escape/abs.txt", "~/clawgym-fuzz-escape.txt",
           "C:/escape.txt", "a/../../escape.txt", "", " ", ".", "..", "a\x00b", "task_good", "data.csv"]
WORDS = ["automated", "hybrid", "llm_judge", "vibes", "nan", "1e400", "-1", "0.5", "ninety", "\ud800", "é", "🦀"]
KEYS = ["id", "name", "category", "grading_type", "grading_weights", "automated", "llm_judge", "timeout_seconds",
        "workspace_files", "path", "content", "source", "dest", "sessions", "prompt", "new_session", "prerequisites",
        "task_id", "user_query", "metadata", "rules", "rule(s)", "scores", "file_path", "target_file", "skip_rubric",
        "input_mount_dir", "categories"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12),
                    st.sampled_from(HOSTILE + WORDS))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), inner, max_size=4),
                        max_leaves=10)
raw_bytes = st.binary(max_size=300)


def _snapshot(root: Path, skip: Path) -> dict[str, str]:
    """Every path under `root` except `skip`, with its link target or content hash."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if d == skip or skip in d.parents:
            continue
        for name in dirnames + filenames:
            p = d / name
            if p == skip:
                continue
            out[str(p.relative_to(root))] = ("link:" + os.readlink(p) if p.is_symlink() else
                                             "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _write(p: Path, data: str | bytes) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)


def _check_import(source: str, src: Path, good_id: str) -> None:
    root = src.parent
    dst = root / "out"
    before = _snapshot(root, dst)
    try:
        report = import_tasks(source, src, dst)
    except UserError as e:  # a set-level problem: one line, nothing written
        assert "\n" not in str(e)
        report = None
    assert _snapshot(root, dst) == before  # the source tree and everything beside DST unchanged
    assert not Path("/tmp/clawgym-fuzz-escape").exists() and not (Path.home() / "clawgym-fuzz-escape.txt").exists()
    if report is None:
        return
    for name, reason in report.skipped + report.notes:
        assert not reason.startswith(UNEXPECTED) and "\n" not in reason, (name, reason)
    assert good_id in {t.id for t in report.imported}, report.skipped
    assert not [p.name for p in dst.iterdir() if p.name.startswith(".")]  # no temp folder left behind
    for t in report.imported:
        assert t.path.parent == dst.resolve() or t.path.parent == dst.absolute()


# ---------------------------------------------------------------------------------------------
# PinchBench
# ---------------------------------------------------------------------------------------------

PINCH_FM = {"id": "task_fuzz", "grading_type": "automated", "timeout_seconds": 60,
            "workspace_files": [{"path": "a.txt", "content": "x"}, {"source": "data.csv", "dest": "d.csv"}]}
PINCH_BODY = PINCH.split("---\n", 2)[2]


def _yaml(doc: object) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=False)
    except yaml.YAMLError:
        return "id: [unclosed"


# Front-matter fields, each given a malformed value, alone or with one more.
PINCH_FIELDS = {
    "id": anything,
    "grading_type": anything,
    "grading_weights": st.one_of(anything, st.dictionaries(st.sampled_from(["automated", "llm_judge"]), anything, max_size=2)),
    "timeout_seconds": anything,
    "workspace_files": st.one_of(anything, st.lists(st.dictionaries(st.sampled_from(["path", "content", "source", "dest"]),
                                                                    st.sampled_from(HOSTILE) | anything, max_size=3), max_size=3)),
    "sessions": st.one_of(anything, st.lists(st.dictionaries(st.sampled_from(["id", "prompt", "new_session"]), anything, max_size=3), max_size=2)),
    "prerequisites": anything,
    "name": anything,
    "category": anything,
}
# Per field: that field given a malformed value (with up to one other field spoiled too).
pinch_files = {
    field: st.builds(lambda v, more, body, field=field: f"---\n{_yaml({**PINCH_FM, **more, field: v})}---\n{body}",
                     values, st.dictionaries(st.sampled_from(sorted(PINCH_FIELDS)), anything, max_size=1),
                     st.sampled_from([PINCH_BODY, PINCH_BODY, "", "## Prompt\n\n"]))
    for field, values in PINCH_FIELDS.items()
}
pinch_files["whole file"] = st.one_of(st.builds(lambda fm, body: f"---\n{_yaml(fm)}---\n{body}", anything, st.text(max_size=80)),
                                      st.text(max_size=200), raw_bytes)
FIELD_FUZZ = settings(FUZZ, max_examples=40)


@pytest.mark.slow
@pytest.mark.parametrize("field", list(pinch_files))
def test_pinchbench_import_fuzzed(field: str) -> None:
    @FIELD_FUZZ
    @given(task=pinch_files[field], manifest=st.one_of(st.none(), anything.map(_yaml), st.text(max_size=60), raw_bytes))
    def one(task: str | bytes, manifest: str | bytes | None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "pb"
            (src / "tasks").mkdir(parents=True)
            (src / "assets").mkdir()
            (src / "assets" / "data.csv").write_text("a,b\n1,2\n")
            (src / "tasks" / "task_good.md").write_text(PINCH.replace("id: task_demo", "id: task_good"))
            _write(src / "tasks" / "task_fuzz.md", task)
            if manifest is not None:
                _write(src / "tasks" / "manifest.yaml", manifest)
            _check_import("pinchbench", src, "task_good")

    one()


# ---------------------------------------------------------------------------------------------
# ClawGym
# ---------------------------------------------------------------------------------------------

GOOD_ENTRY = {"task_id": "task_good", "user_query": "Write out.txt.", "metadata": {"category": "Demo"}}
rule = st.one_of(anything, st.fixed_dictionaries({}, optional={
    "name": anything, "rule": anything, "file_path": st.sampled_from(HOSTILE) | anything,
    "scores": st.dictionaries(st.sampled_from(["0", "0.5", "1", "good", "nan", "2", "-1"]) | st.text(max_size=4), anything, max_size=3) | anything}))
ENTRY_FIELDS = {"task_id": anything, "user_query": anything, "metadata": anything, "input_mount_dir": anything,
                "rules": st.one_of(anything, st.lists(rule, max_size=3)), "rule(s)": st.lists(rule, max_size=2)}
entries = {
    field: st.builds(lambda v, more, field=field: json.dumps({"task_id": "task_fuzz", "user_query": "Do it.", **more, field: v}),
                     values, st.dictionaries(st.sampled_from(sorted(ENTRY_FIELDS)), anything, max_size=1))
    for field, values in ENTRY_FIELDS.items()
}
entries["metadata.rules"] = st.builds(lambda r: json.dumps({"task_id": "task_fuzz", "user_query": "Do it.", "metadata": {"rules": r}}),
                                      st.one_of(st.lists(rule, max_size=2), anything))
entries["whole file"] = st.one_of(anything.map(json.dumps), st.text(max_size=100), raw_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("field", list(entries))
def test_clawgym_import_fuzzed(field: str) -> None:
    @FIELD_FUZZ
    @given(entry=entries[field], link_input=st.booleans())
    def one(entry: str | bytes, link_input: bool) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "cg"
            _write(Path(tmp) / "host" / "secret.txt", "host file\n")
            for name, data in (("task_good", json.dumps(GOOD_ENTRY)), ("task_fuzz", entry)):
                _write(src / name / "reward" / "check.py", "print('{}')\n")
                (src / name / "input_files").mkdir()
                _write(src / name / "data_entry.json", data)
            if link_input:  # a link out of the task folder: that task is skipped, the host file never copied
                os.symlink(Path(tmp) / "host", src / "task_fuzz" / "input_files" / "logs")
            _check_import("clawgym", src, "task_good")
            out = Path(tmp) / "out"
            assert not [p for p in out.rglob("secret.txt")] if out.exists() else True

    one()


# ---------------------------------------------------------------------------------------------
# Harbor and native task.toml, from fragments
# ---------------------------------------------------------------------------------------------

toml_values = st.sampled_from(["true", "1", "-5", "0", '"x"', '"../escape"', "[1, 2]", '["network"]', '["teleport"]', "{a = 1}",
                               "nan", "inf", "1979-05-27", "1979-05-27T07:32:00Z", '"check"', '"none"', '"harbor"', '"a b"', "1e400"])
toml_keys = st.sampled_from(["version", "id", "category", "allow_internet", "timeout_sec", "kind", "code", "rubric", "gate",
                             "needs", "tools", "workdir", "memory_mb", "cpus", "docker_image", "metadata", "environment", "noop",
                             "instruction", "name", "new_session", "transcript_format", "env", "user"])
toml_lines = st.one_of(
    st.sampled_from(["[metadata]", "[agent]", "[verifier]", "[verifier.weights]", "[verifier.baseline]", "[environment]",
                     "[claw]", "[[claw.sessions]]", "[[metadata]]", "[claw.needs]"]),
    st.builds(lambda k, v: f"{k} = {v}", toml_keys, toml_values),
    st.text(max_size=20),
)
toml_texts = st.one_of(st.lists(toml_lines, max_size=8).map("\n".join), raw_bytes)
text_parts = st.one_of(st.text(max_size=80), raw_bytes, st.just(b"R\xe9sum\xe9\n"), st.just(""))


@pytest.mark.slow
@FUZZ
@given(toml=toml_texts, instruction=text_parts, test_sh=st.booleans())
def test_harbor_import_fuzzed(toml: str | bytes, instruction: str | bytes, test_sh: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hb"
        for name, t, ins in (("good", 'version = "1.0"\n', "Create /app/hello.txt\n"), ("fuzz", toml, instruction)):
            _write(src / name / "task.toml", t)
            _write(src / name / "instruction.md", ins)
            if name == "good" or test_sh:
                _write(src / name / "tests" / "test.sh", "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
        _check_import("harbor", src, "good")


@pytest.mark.slow
@FUZZ
@given(toml=toml_texts, instruction=text_parts, rubric=st.one_of(st.none(), text_parts), check=st.booleans())
def test_validate_fuzzed(toml: str | bytes, instruction: str | bytes, rubric: str | bytes | None, check: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tasks"
        _write(root / "good" / "task.toml", "[metadata]\ncategory = 'demo'\n")
        _write(root / "good" / "instruction.md", "Write 42 to answer.txt.\n")
        _write(root / "good" / "tests" / "rubric.md", "Is it right?\n")
        _write(root / "fuzz" / "task.toml", toml)
        _write(root / "fuzz" / "instruction.md", instruction)
        (root / "fuzz" / "workspace").mkdir()
        if rubric is not None:
            _write(root / "fuzz" / "tests" / "rubric.md", rubric)
        if check:  # exits at once: a check that runs does not slow the fuzzing down
            _write(root / "fuzz" / "tests" / "check.py", "print('{\"ok\": 0}')\n")
        before = _snapshot(Path(tmp), Path(tmp) / "none")
        report = validate_tasks(root, sandbox_config=SandboxConfig(network="blackhole"), jobs=1)
        assert _snapshot(Path(tmp), Path(tmp) / "none") == before  # validation writes nothing into the task folders
        by_name = {Path(r.path).name: r for r in report.tasks}
        assert by_name["good"].status == "no_code" and by_name["good"].error == ""
        fuzz = by_name["fuzz"]
        assert not fuzz.error.startswith(UNEXPECTED) and "\n" not in fuzz.error, fuzz.error
        assert fuzz.status in ("ok", "invalid", "no_code", "check_error")
