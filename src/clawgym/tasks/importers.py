"""Importers: PinchBench, ClawGym and Harbor task sets -> native task folders (docs/tasks.md).

Each importer reproduces its source's own scoring rule in the native format:

- PinchBench (`tasks/*.md`): the embedded `grade(transcript, workspace)` becomes tests/check.py;
  code score = unweighted mean of its criteria; `grading_type` + `grading_weights` give the
  weights (automated 1/0, llm_judge 0/1, hybrid given or 0.5/0.5); the "LLM Judge Rubric" (or the
  "Grading Criteria" checklist) becomes tests/rubric.md. `workspace_files` become workspace/.
- ClawGym (`task_*/data_entry.json` + `input_files/` + `reward/`): reward/ becomes tests/ and its
  check.py runs as `python3 check.py WORKSPACE` (what reward.sh does); score = mean of the printed
  dict; rubric `rules` -> tests/rubric.md with weights 0.7/0.3, as on ClawGym-Bench.
- Harbor (`task.toml` + `instruction.md` + `tests/test.sh`): kept as is (reward.txt or the mean of
  reward.json); `environment/` is copied and the task is flagged `docker`.

One bad source task is skipped with its reason; the rest import. `IMPORTERS` maps names to functions.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from clawgym.errors import UserError
from clawgym.tasks.flags import needs_from_text, reads_transcript, tools_from_code
from clawgym.tasks.pinchbench import iter_pinchbench
from clawgym.tasks.rubric import Criterion, write_rubric
from clawgym.tasks.source import UNEXPECTED, ImportContext, check_id, mapping, number, read_text, sequence
from clawgym.tasks.spec import Task, check_tree
from clawgym.tasks.writer import TaskDraft, write_task

Importer = Callable[[Path, ImportContext], Iterator[tuple[str, Callable[[], TaskDraft]]]]


@dataclass
class ImportReport:
    imported: list[Task] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(source item, reason)"""
    notes: list[tuple[str, str]] = field(default_factory=list)
    """(source item, problem) for set-level problems that skip no task"""


# ---------------------------------------------------------------------------------------------
# ClawGym
# ---------------------------------------------------------------------------------------------


def _clawgym_rules(entry: dict, meta: dict) -> list[Criterion]:
    raw = entry.get("rules", entry.get("rule(s)", meta.get("rules", meta.get("rule"))))
    if isinstance(raw, dict):
        if raw.get("skip_rubric"):
            return []
        raw = raw.get("rules", [])
    out = []
    for i, r in enumerate(sequence(raw, "field 'rules'")):
        if isinstance(r, str):
            out.append(Criterion(name=f"rule {i + 1}", description=r))
            continue
        if not isinstance(r, dict):
            raise UserError(f"rules[{i}]: must be an object with name and scores/rule")
        files = [str(f) for f in (r.get("file_path"), r.get("target_file")) if f]
        scores = mapping(r.get("scores"), f"rules[{i}] field 'scores' (score -> text)")
        anchors = {number(k, f"rules[{i}] field 'scores': key {k!r}"): str(v) for k, v in scores.items()}
        if any(a > 1 for a in anchors):
            raise UserError(f"rules[{i}] field 'scores': keys must be scores in [0, 1], got {sorted(anchors)}")
        out.append(Criterion(name=str(r.get("name", f"rule {i + 1}")), description=str(r.get("rule", "")), anchor_text=anchors, files=tuple(files)))
    return out


def _clawgym_draft(d: Path) -> TaskDraft:
    check_tree(d, str(d))  # a source file linked out of the task folder would be read or copied in
    entry_path = d / "data_entry.json"
    try:
        entry = json.loads(read_text(entry_path))
    except json.JSONDecodeError as e:
        raise UserError(f"{entry_path}: not valid JSON ({e})") from None
    if not isinstance(entry, dict):
        raise UserError(f"{entry_path}: must be a JSON object (task_id, user_query, metadata), got {type(entry).__name__}")
    task_id = check_id(entry.get("task_id", d.name), f"{entry_path}: field 'task_id'")
    query = entry.get("user_query")
    if not isinstance(query, str) or not query.strip():
        raise UserError(f"{entry_path}: field 'user_query' is missing or empty")
    check = d / "reward" / "check.py"
    if not check.is_file():
        raise UserError(f"{d}: missing reward/check.py")
    try:
        meta = mapping(entry.get("metadata"), "field 'metadata'")
        rules = _clawgym_rules(entry, meta)
    except UserError as e:
        raise UserError(f"{entry_path}: {e}") from None
    # Graders may call tools from helper modules or reward.sh, not only check.py.
    code = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted((d / "reward").rglob("*"))
                     if p.is_file() and p.suffix in (".py", ".sh"))
    needs = needs_from_text(query)
    if reads_transcript(code):
        needs.add("transcript")
    draft = TaskDraft(id=task_id, instruction=query, toml={})
    if (d / "input_files").is_dir():
        draft.workspace_copy[""] = d / "input_files"
    draft.tests_copy[""] = d / "reward"
    if rules:
        draft.tests_text["rubric.md"] = write_rubric(rules)
    draft.toml = {
        "version": "1.0",
        "metadata": {
            "id": task_id,
            "category": str(meta.get("category") or ""),
            "source": f"clawgym:{d.name}",
            "grading_type": str(meta.get("grading_type", "automated")),
            "mount_dir": str(entry.get("input_mount_dir", "")),
        },
        "agent": {"timeout_sec": 600.0},
        "verifier": {"timeout_sec": 120.0, "kind": "check", "weights": {"code": 0.7 if rules else 1.0, "rubric": 0.3 if rules else 0.0}},
        "environment": {"allow_internet": "network" in needs},
        "claw": {"needs": sorted(needs), "tools": tools_from_code(code), "transcript_format": "openclaw-v1"},
    }
    return draft


def _iter_clawgym(src: Path, ctx: ImportContext) -> Iterator[tuple[str, Callable[[], TaskDraft]]]:
    dirs = [src] if (src / "data_entry.json").is_file() else sorted(p for p in src.iterdir() if (p / "data_entry.json").is_file()) if src.is_dir() else []
    if not dirs:
        raise UserError(f"{src}: no ClawGym tasks (*/data_entry.json)")
    for d in dirs:
        yield d.name, lambda d=d: _clawgym_draft(d)


# ---------------------------------------------------------------------------------------------
# Harbor
# ---------------------------------------------------------------------------------------------


def _harbor_draft(d: Path) -> TaskDraft:
    check_tree(d, str(d))  # a source file linked out of the task folder would be read or copied in
    try:
        doc = tomllib.loads(read_text(d / "task.toml"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{d}/task.toml: not valid TOML ({e})") from None
    if not (d / "instruction.md").is_file():
        raise UserError(f"{d}: missing instruction.md")
    if not (d / "tests" / "test.sh").is_file():
        raise UserError(f"{d}: missing tests/test.sh (Harbor's verifier entry point)")
    task_id = check_id(d.name, f"{d}: folder name")
    w = f"{d}/task.toml:"
    meta = dict(mapping(doc.get("metadata"), f"{w} [metadata]"))
    meta.update({"id": task_id, "source": f"harbor:{d.name}"})
    env = dict(mapping(doc.get("environment"), f"{w} [environment]"))
    test_sh = (d / "tests" / "test.sh").read_text(encoding="utf-8", errors="replace")
    needs = {"docker"} if (d / "environment").is_dir() else set()
    # Harbor allows internet unless told otherwise; verifiers that install tools need it.
    if env.get("allow_internet", True) or re.search(r"\b(apt-get|curl|wget|pip install|uvx?)\b", test_sh):
        needs.add("network")
    env["allow_internet"] = "network" in needs
    env.setdefault("workdir", "/app")
    ver = dict(mapping(doc.get("verifier"), f"{w} [verifier]"))
    ver = {k: v for k, v in ver.items() if k in ("timeout_sec", "env", "user")}
    ver.update({"kind": "harbor", "weights": {"code": 1.0, "rubric": 0.0}})
    draft = TaskDraft(id=task_id, instruction=read_text(d / "instruction.md"), toml={})
    draft.tests_copy[""] = d / "tests"
    for extra in ("environment", "solution"):
        if (d / extra).is_dir():
            draft.extra_copy[extra] = d / extra
    draft.toml = {
        "version": str(doc.get("version", "1.0")),
        "metadata": meta,
        "agent": dict(mapping(doc.get("agent"), f"{w} [agent]")),
        "verifier": ver,
        "environment": env,
        "claw": {"needs": sorted(needs)},
    }
    return draft


def _iter_harbor(src: Path, ctx: ImportContext) -> Iterator[tuple[str, Callable[[], TaskDraft]]]:
    dirs = [src] if (src / "task.toml").is_file() else sorted(p.parent for p in src.rglob("task.toml")) if src.is_dir() else []
    if not dirs:
        raise UserError(f"{src}: no Harbor tasks (*/task.toml)")
    for d in dirs:
        yield d.name, lambda d=d: _harbor_draft(d)


IMPORTERS: dict[str, Importer] = {
    "pinchbench": iter_pinchbench,
    "clawgym": _iter_clawgym,
    "harbor": _iter_harbor,
}


def import_tasks(source: str, src: str | Path, dst: str | Path, *, force: bool = False,
                 assets: str | Path | None = None) -> ImportReport:
    """Import every task of `src` (a `source` task set) into native folders under `dst`.

    `assets` names PinchBench's assets root when it is not `SRC/assets` (it may lie outside SRC)."""
    if source not in IMPORTERS:
        raise UserError(f"unknown task source {source!r}; choose one of: {', '.join(IMPORTERS)}")
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise UserError(f"{src}: no such file or directory")
    if assets is not None and source != "pinchbench":
        raise UserError(f"--assets applies to --from pinchbench only, not {source}")
    if assets is not None and not Path(assets).is_dir():
        raise UserError(f"{assets}: the assets root is not a folder")
    if dst.exists() and not dst.is_dir():
        raise UserError(f"{dst}: exists and is not a folder; name a folder to import into")
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{dst}: cannot create the destination folder ({e.strerror or e})") from None
    ctx = ImportContext(assets=None if assets is None else Path(assets))
    report = ImportReport(notes=ctx.notes)
    first: dict[str, str] = {}  # task id -> the source item imported under it in this run
    for name, build in IMPORTERS[source](src, ctx):
        try:
            draft = build()
            if draft.id in first:
                raise UserError(f"task id '{draft.id}' is also the id of {first[draft.id]}, imported first; "
                                "this one is skipped (the first is kept)")
            report.imported.append(write_task(draft, dst, force=force))
            first[draft.id] = name
        except UserError as e:
            report.skipped.append((name, str(e)))
        except Exception as e:  # noqa: BLE001 - one malformed task must not abort the set
            report.skipped.append((name, f"{UNEXPECTED}: {type(e).__name__}: {e}"))
    return report
