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
from clawgym.tasks.rubric import Criterion, write_rubric
from clawgym.tasks.spec import TASK_ID_RE, Task, check_tree
from clawgym.tasks.writer import TaskDraft, write_task

# Prompt words that mean live web access (checked against the research report's hand
# classification of PinchBench v2.0.0; see docs/tasks.md for the agreement figure).
NETWORK_RE = re.compile(
    r"https?://(?!localhost|127\.0\.0\.1|example\.)|\bresearch\b|\bfetch(es)?\b|\b(find|list) \d+ upcoming\b"
    r"|\bcurrent stock price|\bcurrent price of|\bas of [A-Z][a-z]+ \d|\byoutube\b|\bweb[ _-]?search|\bweb[ _-]fetch"
    r"|\bsearch the (web|internet)|\bgenerate an image\b|\bon github\b|\bapi\.\w|\bpricing\b.*\bproviders?\b",
    re.I | re.S,
)
# Phrases that say the opposite; they win over NETWORK_RE.
OFFLINE_RE = re.compile(
    r"\b(no|without) (internet|network)( access)?\b|\boffline\b|\bdo not fetch\b|\bnot\b[^.]{0,60}\bfrom the internet"
    r"|\b(do not|don't|never) (browse|access|use) (the )?(internet|web|network)|\buse only the provided\b"
    r"|\bbased on your (own )?knowledge\b",
    re.I,
)
BROWSER_RE = re.compile(r"\b(playwright|chromium|selenium|headless browser|puppeteer)\b", re.I)
TRANSCRIPT_RE = re.compile(r"for\s+\w+\s+in\s+transcript|transcript\s*\[|len\(\s*transcript\s*\)|in\s+transcript\b")
TOOL_RE = re.compile(r"""["'](git|pytest|bash|node|npm|npx|gh|gws)["']|-m["',\s]+pytest""")


@dataclass
class ImportReport:
    imported: list[Task] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(source item, reason)"""


def _needs_from_text(prompt: str) -> set[str]:
    needs = set()
    if NETWORK_RE.search(prompt) and not OFFLINE_RE.search(prompt):
        needs.add("network")
    if BROWSER_RE.search(prompt):
        needs.add("browser")
    return needs


def _tools_from_code(code: str) -> list[str]:
    found = {m.group(1) or "pytest" for m in TOOL_RE.finditer(code)}
    return sorted(found)


def _check_id(task_id: str, where: str) -> str:
    if not isinstance(task_id, str) or not TASK_ID_RE.match(task_id):
        raise UserError(f"{where}: task id {task_id!r} must match {TASK_ID_RE.pattern}")
    return task_id


def _iter_pinchbench(src: Path) -> Iterator[tuple[str, Callable[[], TaskDraft]]]:
    from clawgym.tasks.pinchbench import iter_pinchbench

    return iter_pinchbench(src)


# ---------------------------------------------------------------------------------------------
# ClawGym
# ---------------------------------------------------------------------------------------------


def _clawgym_rules(entry: dict) -> list[Criterion]:
    meta = entry.get("metadata") or {}
    raw = entry.get("rules", entry.get("rule(s)", meta.get("rules", meta.get("rule"))))
    if isinstance(raw, dict):
        if raw.get("skip_rubric"):
            return []
        raw = raw.get("rules", [])
    out = []
    for i, r in enumerate(raw or []):
        if isinstance(r, str):
            out.append(Criterion(name=f"rule {i + 1}", description=r))
            continue
        if not isinstance(r, dict):
            raise UserError(f"rules[{i}]: must be an object with name and scores/rule")
        files = [f for f in (r.get("file_path"), r.get("target_file")) if f]
        anchors = {float(k): str(v) for k, v in (r.get("scores") or {}).items()}
        out.append(Criterion(name=str(r.get("name", f"rule {i + 1}")), description=str(r.get("rule", "")), anchor_text=anchors, files=tuple(files)))
    return out


def _clawgym_draft(d: Path) -> TaskDraft:
    check_tree(d, str(d))  # a source file linked out of the task folder would be read or copied in
    entry_path = d / "data_entry.json"
    try:
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{entry_path}: not readable JSON ({e})") from None
    task_id = _check_id(entry.get("task_id", d.name), f"{entry_path}: field 'task_id'")
    query = entry.get("user_query")
    if not isinstance(query, str) or not query.strip():
        raise UserError(f"{entry_path}: field 'user_query' is missing or empty")
    check = d / "reward" / "check.py"
    if not check.is_file():
        raise UserError(f"{d}: missing reward/check.py")
    meta = entry.get("metadata") or {}
    try:
        rules = _clawgym_rules(entry)
    except UserError as e:
        raise UserError(f"{entry_path}: {e}") from None
    code = check.read_text(encoding="utf-8", errors="replace")
    needs = _needs_from_text(query)
    if TRANSCRIPT_RE.search(code):
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
        "claw": {"needs": sorted(needs), "tools": _tools_from_code(code), "transcript_format": "openclaw-v1"},
    }
    return draft


def _iter_clawgym(src: Path) -> Iterator[tuple[str, Callable[[], TaskDraft]]]:
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
        doc = tomllib.loads((d / "task.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{d}/task.toml: not valid TOML ({e})") from None
    if not (d / "instruction.md").is_file():
        raise UserError(f"{d}: missing instruction.md")
    if not (d / "tests" / "test.sh").is_file():
        raise UserError(f"{d}: missing tests/test.sh (Harbor's verifier entry point)")
    task_id = _check_id(d.name, f"{d}: folder name")
    meta = dict(doc.get("metadata") or {})
    meta.update({"id": task_id, "source": f"harbor:{d.name}"})
    env = dict(doc.get("environment") or {})
    test_sh = (d / "tests" / "test.sh").read_text(encoding="utf-8", errors="replace")
    needs = {"docker"} if (d / "environment").is_dir() else set()
    # Harbor allows internet unless told otherwise; verifiers that install tools need it.
    if env.get("allow_internet", True) or re.search(r"\b(apt-get|curl|wget|pip install|uvx?)\b", test_sh):
        needs.add("network")
    env["allow_internet"] = "network" in needs
    env.setdefault("workdir", "/app")
    ver = dict(doc.get("verifier") or {})
    ver = {k: v for k, v in ver.items() if k in ("timeout_sec", "env", "user")}
    ver.update({"kind": "harbor", "weights": {"code": 1.0, "rubric": 0.0}})
    draft = TaskDraft(id=task_id, instruction=(d / "instruction.md").read_text(encoding="utf-8"), toml={})
    draft.tests_copy[""] = d / "tests"
    for extra in ("environment", "solution"):
        if (d / extra).is_dir():
            draft.extra_copy[extra] = d / extra
    draft.toml = {
        "version": str(doc.get("version", "1.0")),
        "metadata": meta,
        "agent": dict(doc.get("agent") or {}),
        "verifier": ver,
        "environment": env,
        "claw": {"needs": sorted(needs)},
    }
    return draft


def _iter_harbor(src: Path) -> Iterator[tuple[str, Callable[[], TaskDraft]]]:
    dirs = [src] if (src / "task.toml").is_file() else sorted(p.parent for p in src.rglob("task.toml")) if src.is_dir() else []
    if not dirs:
        raise UserError(f"{src}: no Harbor tasks (*/task.toml)")
    for d in dirs:
        yield d.name, lambda d=d: _harbor_draft(d)


IMPORTERS: dict[str, Callable[[Path], Iterator[tuple[str, Callable[[], TaskDraft]]]]] = {
    "pinchbench": _iter_pinchbench,
    "clawgym": _iter_clawgym,
    "harbor": _iter_harbor,
}


def import_tasks(source: str, src: str | Path, dst: str | Path, *, force: bool = False) -> ImportReport:
    """Import every task of `src` (a `source` task set) into native folders under `dst`."""
    if source not in IMPORTERS:
        raise UserError(f"unknown task source {source!r}; choose one of: {', '.join(IMPORTERS)}")
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise UserError(f"{src}: no such file or directory")
    report = ImportReport()
    for name, build in IMPORTERS[source](src):
        try:
            report.imported.append(write_task(build(), dst, force=force))
        except UserError as e:
            report.skipped.append((name, str(e)))
    return report
