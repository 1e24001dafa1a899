"""PinchBench v2 (`tasks/*.md`) -> native task folders; registered in importers.IMPORTERS.

A PinchBench task is one Markdown file: YAML front matter (id, category, grading_type,
grading_weights, timeout_seconds, workspace_files, sessions, prerequisites) and `## ` sections
(Prompt, Expected Behavior, Grading Criteria, Automated Checks, LLM Judge Rubric). The embedded
`grade(transcript, workspace)` is kept verbatim as tests/grade.py behind a small check.py that
prints its criteria; the code score is their unweighted mean, as in PinchBench's lib_grading.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterator

import yaml

from clawgym.errors import UserError
from clawgym.tasks.flags import needs_from_text, reads_transcript, tools_from_code
from clawgym.tasks.rubric import Criterion, write_rubric
from clawgym.tasks.source import ImportContext, check_id, inside, mapping, number, one_line, read_text, sequence
from clawgym.tasks.spec import safe_relpath
from clawgym.tasks.writer import TaskDraft

# ---------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def split_sections(body: str) -> dict[str, str]:
    """Markdown body -> {'## ' heading: text}, ignoring headings inside fenced code."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    fence: str | None = None
    for line in body.splitlines():
        m = _FENCE.match(line)
        if m:
            marker = m.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence) and not line.strip()[len(marker):].strip():
                fence = None
        if fence is None and line.startswith("## ") and not m:
            current = sections.setdefault(line[3:].strip(), [])
            continue
        if current is not None:
            current.append(line)
    return {k: "\n".join(v).strip() for k, v in sections.items()}


def _python_block(text: str) -> str | None:
    m = re.search(r"^```(?:python|py)\s*\n(.*?)^```\s*$", text, re.S | re.M)
    return m.group(1) if m else None


_PINCH_CHECK = '''"""PinchBench automated checks, wrapped for clawgym (do not edit; see grade.py).

Run as `python3 check.py WORKSPACE`: calls the task's own grade(transcript, workspace) and prints
its criteria as a JSON dict. The transcript (OpenClaw event list) comes from $CLAWGYM_TRANSCRIPT.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grade import grade  # noqa: E402


def main() -> None:
    workspace = sys.argv[1] if len(sys.argv) > 1 else "."
    transcript = []
    path = os.environ.get("CLAWGYM_TRANSCRIPT")
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            transcript = json.load(f)
    scores = grade(transcript, workspace)
    print(json.dumps({str(k): float(v) for k, v in (scores or {}).items()}))


if __name__ == "__main__":
    main()
'''


def _pinch_rubric(sections: dict[str, str]) -> str | None:
    preamble = ""
    if sections.get("Expected Behavior"):
        preamble = "Expected behavior:\n\n" + sections["Expected Behavior"]
    rubric = sections.get("LLM Judge Rubric")
    if rubric:
        return (preamble + "\n\n" if preamble else "") + rubric + "\n"
    items = re.findall(r"^\s*[-*]\s*\[[ xX]?\]\s*(.+)$", sections.get("Grading Criteria", ""), re.M)
    if not items:
        return None
    criteria = [Criterion(name=f"item {i + 1}", description=t.strip()) for i, t in enumerate(items)]
    return write_rubric(criteria, preamble)


def _workspace_files(draft: TaskDraft, fm: dict, md: Path, assets: Path | str) -> None:
    """The front matter's workspace_files into the draft: inline texts, and assets copied from the
    assets root (`assets` is a string saying why it may not be used)."""
    for i, wf in enumerate(sequence(fm.get("workspace_files"), f"{md}: field 'workspace_files'")):
        where = f"{md}: workspace_files[{i}]"
        if not isinstance(wf, dict):
            raise UserError(f"{where}: must be a mapping with path+content or source+dest")
        if "content" in wf:
            dest = str(safe_relpath(str(wf.get("path", "")), f"{where} field 'path'"))
            draft.workspace_text[dest] = str(wf["content"])
        elif "source" in wf:
            src_rel = safe_relpath(str(wf["source"]), f"{where} field 'source'")
            dest = str(safe_relpath(str(wf.get("dest") or src_rel.name), f"{where} field 'dest'"))
            if isinstance(assets, str):
                raise UserError(f"{where}: {assets}")
            src = assets.joinpath(*src_rel.parts)
            if not src.exists():
                raise UserError(f"{where}: asset '{wf['source']}' not found under {assets}")
            draft.workspace_copy[dest] = inside(src, assets, f"{where} asset '{wf['source']}'")
        else:
            raise UserError(f"{where}: needs 'path'+'content' or 'source'+'dest'")


def _pinch_draft(md: Path, assets: Path | str, categories: dict[str, str], version: str) -> TaskDraft:
    """One task file -> a draft. `assets` is the assets root, or why it may not be used."""
    text = read_text(inside(md, md.parent, str(md)))  # a task file linked out of its folder would be read in
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n(.*)$", text, re.S)
    if not m:
        raise UserError(f"{md}: no YAML front matter between '---' lines")
    try:
        fm = yaml.safe_load(m.group(1)) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{md}: front matter is not valid YAML ({one_line(e)})") from None
    if not isinstance(fm, dict):
        raise UserError(f"{md}: front matter must be a mapping")
    task_id = check_id(fm.get("id", md.stem), f"{md}: field 'id'")
    sections = split_sections(m.group(2))
    grading = fm.get("grading_type", "automated")
    if grading not in ("automated", "llm_judge", "hybrid"):
        raise UserError(f"{md}: field 'grading_type' is {grading!r}; expected automated, llm_judge or hybrid")

    code = _python_block(sections.get("Automated Checks", ""))
    if grading != "llm_judge" and (code is None or "def grade" not in code):
        raise UserError(f"{md}: grading_type '{grading}' needs a ```python block defining grade() under '## Automated Checks'")
    rubric = _pinch_rubric(sections) if grading != "automated" else None
    if grading != "automated" and rubric is None:
        raise UserError(f"{md}: grading_type '{grading}' needs '## LLM Judge Rubric' or a '## Grading Criteria' checklist")
    gw = mapping(fm.get("grading_weights"), f"{md}: field 'grading_weights'")
    w_code, w_rubric = {"automated": (1.0, 0.0), "llm_judge": (0.0, 1.0)}.get(grading) or (
        number(gw.get("automated", 0.5), f"{md}: field 'grading_weights.automated'"),
        number(gw.get("llm_judge", 0.5), f"{md}: field 'grading_weights.llm_judge'"),
    )
    if grading == "hybrid" and w_code + w_rubric <= 0:
        raise UserError(f"{md}: field 'grading_weights' must have a positive sum, got {w_code} and {w_rubric}")
    timeout = number(fm.get("timeout_seconds", 600), f"{md}: field 'timeout_seconds'", positive=True)

    draft = TaskDraft(id=task_id, instruction="", toml={})
    _workspace_files(draft, fm, md, assets)

    sessions = []
    for i, s in enumerate(sequence(fm.get("sessions"), f"{md}: field 'sessions'")):
        if not isinstance(s, dict) or not str(s.get("prompt", "")).strip():
            raise UserError(f"{md}: sessions[{i}] needs a 'prompt'")
        sessions.append({"name": str(s.get("id", f"session_{i + 1}")), "instruction": str(s["prompt"]), "new_session": bool(s.get("new_session", False))})
    prompt = sessions[0]["instruction"] if sessions else sections.get("Prompt", "")
    if not prompt.strip():
        raise UserError(f"{md}: '## Prompt' is missing or empty")
    draft.instruction = prompt

    prereq = [str(p) for p in sequence(fm.get("prerequisites"), f"{md}: field 'prerequisites'")]
    needs = needs_from_text(prompt + "\n" + "\n".join(s["instruction"] for s in sessions))
    if any(p.startswith(("npm:", "cli:")) for p in prereq):
        needs.add("services")
    if code and reads_transcript(code):
        needs.add("transcript")
    tools = sorted(set(tools_from_code(code or "")) | {p.split(":", 1)[1] for p in prereq if p.startswith("cli:")})

    if code:
        draft.tests_text["grade.py"] = code
        draft.tests_text["check.py"] = _PINCH_CHECK
    if rubric:
        draft.tests_text["rubric.md"] = rubric
    draft.toml = {
        "version": "1.0",
        "metadata": {
            "id": task_id,
            "name": str(fm.get("name", task_id)),
            "category": categories.get(task_id, str(fm.get("category", ""))),
            "source": f"pinchbench/skill@{version}:tasks/{md.name}",
            "grading_type": grading,
            "prerequisites": prereq,
        },
        "agent": {"timeout_sec": timeout},
        "verifier": {
            "timeout_sec": 120.0,
            "kind": "check" if code else "none",
            "weights": {"code": w_code if code else 0.0, "rubric": w_rubric if rubric else 0.0},
        },
        "environment": {"allow_internet": "network" in needs},
        "claw": {"needs": sorted(needs), "tools": tools, "transcript_format": "openclaw-v1", "sessions": sessions},
    }
    return draft


def _categories(manifest: Path, ctx: ImportContext) -> dict[str, str]:
    """task id -> category from manifest.yaml; a bad manifest is noted and each task's own
    front-matter category is used instead (it only names categories, so no task is skipped)."""
    try:
        doc = mapping(yaml.safe_load(read_text(manifest)), "the document")
        out = {}
        for cat, ids in mapping(doc.get("categories"), "field 'categories'").items():
            for i in sequence(ids, f"field 'categories.{cat}'"):
                out[str(i)] = str(cat)
        return out
    except yaml.YAMLError as e:
        problem = f"not valid YAML ({one_line(e)})"
    except UserError as e:
        problem = str(e).removeprefix(f"{manifest}: ")
    ctx.notes.append((str(manifest), f"{problem}; categories are taken from each task's front matter"))
    return {}


def _assets_root(checkout: Path, ctx: ImportContext) -> Path | str:
    """The assets root, or why it may not be used: SRC/assets must stay inside the checkout (an
    `assets` link to a host folder would copy host files into workspaces); a root the user named
    with --assets is trusted wherever it is."""
    if ctx.assets is not None:
        return ctx.assets
    assets = checkout / "assets"
    if assets.exists() and not assets.resolve().is_relative_to(checkout.resolve()):
        return (f"{assets} leads outside the source tree (to {assets.resolve()}); links that leave it are "
                "refused: name the assets root with --assets to use it")
    return assets


def iter_pinchbench(src: Path, ctx: ImportContext) -> Iterator[tuple[str, Callable[[], TaskDraft]]]:
    tasks_dir = src / "tasks" if (src / "tasks").is_dir() else src
    files = sorted(tasks_dir.glob("task_*.md")) if tasks_dir.is_dir() else []
    if src.is_file() and src.suffix == ".md":
        tasks_dir, files = src.parent, [src]
    if not files:
        raise UserError(f"{src}: no PinchBench task files (tasks/task_*.md)")
    assets = _assets_root(tasks_dir.parent, ctx)
    manifest = tasks_dir / "manifest.yaml"
    categories = _categories(manifest, ctx) if manifest.is_file() else {}
    vfile = tasks_dir.parent / "BENCHMARK_VERSION"
    version = vfile.read_text(encoding="utf-8", errors="replace").strip() if vfile.is_file() else "unknown"
    for md in files:
        yield md.name, lambda md=md: _pinch_draft(md, assets, categories, version)
