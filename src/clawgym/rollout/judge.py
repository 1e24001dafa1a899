"""Rubric scoring by an LLM judge: the paper's Appendix A prompt and its JSON output contract.

The judge is any OpenAI-compatible Chat Completions endpoint (`openai` SDK). It sees the task, the
final output files (the rubric's `Files:` or else every file the rollout added or changed), the
other changed files, an optional transcript summary and the rubric with ids `criterion_1..n`. Its
answer must end with one JSON object `{"scores": {criterion_i: anchor}, "notes": "..."}`; the
parser takes the last such object in the text, tolerates code fences, numeric strings and names
instead of ids, snaps each score to the nearest allowed anchor, and asks again (up to
`max_retries`) when a criterion is missing or nothing parses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from clawgym.rollout.config import JudgeConfig
from clawgym.tasks.rubric import Rubric
from clawgym.tasks.spec import Task, is_binary_file

SYSTEM_PROMPT = (
    "You are a strict rubric-based evaluator. Use only the user prompt content. Do not call tools, browse, "
    "inspect files, or ask for more context. Your response may include concise analysis, but it must end with "
    "exactly one standalone JSON object with keys `scores` and `notes`."
)

USER_PROMPT = """You are grading an OpenClaw agent result. You must not call, request, or simulate any tools. Do not browse, list directories, open files, inspect the workspace, or ask for more context. Grade only from the task, final output files, optional transcript evidence, and rubrics included in this prompt.

Before giving the final judgment, provide concise analysis explaining how the final outputs satisfy or fail each rubric criterion. Your final judgment must end with exactly one standalone JSON object and nothing else after it.

The final JSON object must contain exactly two keys: `scores` and `notes`.
- `scores` must map every rubric id (`criterion_1`, `criterion_2`, ...) to one numeric score chosen from that rubric's allowed score anchors.
- `notes` must be a concise string summarizing the main reasons for the assigned scores.

Do not include any overall score in the final JSON. Do not compute or report the final aggregated score. Score aggregation will be handled separately by post-processing.

## User Task
{USER_TASK}

## Final Output Files
{FINAL_OUTPUT_FILES}

## Additional Changed Workspace Files
{ADDITIONAL_CHANGED_WORKSPACE_FILES}

## Transcript
{TRANSCRIPT_OPTIONAL}

## Rubric
{RUBRIC}
"""

_SKIP_DIRS = {".git", "__pycache__", "node_modules", ".venv", ".pytest_cache", ".mypy_cache"}


@dataclass
class RubricResult:
    score: float | None
    scores: dict[str, float] = field(default_factory=dict)
    """criterion name -> score"""
    notes: str = ""
    error: str = ""
    raw: str = ""
    attempts: int = 0


class JudgeFormatError(ValueError):
    """The judge's answer does not follow the JSON contract."""


def changed_files(workspace: Path, seed: Path | None) -> list[str]:
    """Files under `workspace` that are new or differ from `seed` (relative POSIX paths, sorted)."""
    out = []
    for p in sorted(workspace.rglob("*")):
        rel = p.relative_to(workspace)
        if any(part in _SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]) or not p.is_file() or p.is_symlink():
            continue
        old = seed / rel if seed is not None else None
        if old is None or not old.is_file() or old.read_bytes() != p.read_bytes():
            out.append(rel.as_posix())
    return out


def _render_files(workspace: Path, names: list[str], per_file: int, budget: int) -> tuple[str, int]:
    if not names:
        return "(none)", budget
    parts = []
    for name in names:
        p = workspace / name
        if not p.is_file():
            parts.append(f"### {name}\n(missing: the file does not exist)")
            continue
        if is_binary_file(p):
            parts.append(f"### {name}\n[binary file, {p.stat().st_size} bytes]")
            continue
        text = p.read_text(encoding="utf-8", errors="replace")
        cut = min(per_file, max(0, budget))
        if len(text) > cut:
            text = text[:cut] + f"\n[... truncated, {len(text) - cut} more characters]"
        budget -= len(text)
        parts.append(f"### {name}\n```\n{text}\n```")
    return "\n\n".join(parts), budget


def summarize_transcript(transcript: list | None, limit: int = 20_000) -> str:
    """OpenClaw-style events -> short lines (tool args cut at 200 chars, text at 2,000, as PinchBench)."""
    if not transcript:
        return "(not provided)"
    lines = []
    for ev in transcript:
        msg = ev.get("message", ev) if isinstance(ev, dict) else {}
        role = msg.get("role", "?") if isinstance(msg, dict) else "?"
        content = msg.get("content", "") if isinstance(msg, dict) else str(ev)
        items = content if isinstance(content, list) else [{"type": "text", "text": str(content)}]
        for c in items:
            if not isinstance(c, dict):
                continue
            if c.get("type") == "toolCall":
                args = json.dumps(c.get("arguments", {}), ensure_ascii=False)[:200]
                lines.append(f"[{role}] tool call {c.get('name')}: {args}")
            elif c.get("text"):
                lines.append(f"[{role}] {str(c['text'])[:2000]}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + "\n[... transcript truncated]"


def build_prompt(task: Task, workspace: Path, config: JudgeConfig, *, transcript: list | None = None,
                 final_message: str | None = None) -> list[dict[str, str]]:
    """The chat messages of Appendix A for this task and final workspace."""
    assert task.rubric is not None
    seed = task.workspace_dir if task.workspace_dir.is_dir() else None
    changed = changed_files(workspace, seed)
    finals = list(task.rubric.files) or changed
    others = [f for f in changed if f not in finals]
    user_task = task.instruction.strip()
    for s in task.sessions[1:]:
        user_task += f"\n\n(next message{', in a new session' if s.new_session else ''})\n{s.instruction.strip()}"
    final_text, budget = _render_files(workspace, finals, config.max_file_chars, config.max_total_chars)
    other_text, _ = _render_files(workspace, others, config.max_file_chars, budget)
    transcript_text = summarize_transcript(transcript)
    if final_message:
        transcript_text += f"\n\nFinal message of the agent:\n{final_message[:4000]}"
    user = USER_PROMPT
    for key, value in (("USER_TASK", user_task), ("FINAL_OUTPUT_FILES", final_text), ("ADDITIONAL_CHANGED_WORKSPACE_FILES", other_text),
                       ("TRANSCRIPT_OPTIONAL", transcript_text), ("RUBRIC", task.rubric.render())):
        user = user.replace("{" + key + "}", value)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_judge_output(text: str, rubric: Rubric) -> tuple[dict[str, float], str]:
    """The judge's text -> ({criterion name: snapped score}, notes). Raises JudgeFormatError."""
    dec = json.JSONDecoder()
    obj = None
    for i in range(len(text) - 1, -1, -1):
        if text[i] != "{":
            continue
        try:
            cand, _ = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            continue
        if isinstance(cand, dict) and "scores" in cand:
            obj = cand
            break
    if obj is None:
        raise JudgeFormatError("no JSON object with a 'scores' key in the answer")
    scores = obj["scores"]
    if not isinstance(scores, dict):
        raise JudgeFormatError("'scores' is not an object")
    norm = {str(k).strip().lower().replace(" ", "_"): v for k, v in scores.items()}
    out: dict[str, float] = {}
    for i, (cid, c) in enumerate(zip(rubric.ids(), rubric.criteria)):
        keys = (cid, str(i + 1), c.name.strip().lower().replace(" ", "_"))
        raw = next((norm[k] for k in keys if k in norm), None)
        if isinstance(raw, dict):
            raw = raw.get("score")
        try:
            value = float(raw)  # numbers and numeric strings
        except (TypeError, ValueError):
            raise JudgeFormatError(f"no numeric score for {cid} ({c.name})") from None
        out[c.name] = min(c.anchors, key=lambda a: abs(a - value))
    notes = obj.get("notes", "")
    return out, notes if isinstance(notes, str) else json.dumps(notes)


def aggregate_scores(scores: dict[str, float], rubric: Rubric, how: str = "mean") -> float:
    if how == "weighted":
        total = sum(c.weight for c in rubric.criteria)
        return sum(scores[c.name] * c.weight for c in rubric.criteria) / total
    if how != "mean":
        raise ValueError(f"rubric aggregate {how!r}; allowed: mean, weighted")
    return sum(scores[c.name] for c in rubric.criteria) / len(rubric.criteria)


def judge_rubric(task: Task, workspace: Path, config: JudgeConfig, *, transcript: list | None = None,
                 final_message: str | None = None, aggregate: str = "mean") -> RubricResult:
    """Ask the judge; never raises for the judge's faults (they come back in `error`)."""
    try:
        import openai
    except ImportError:
        return RubricResult(None, error="the judge needs the openai package (pip install openai)")
    messages = build_prompt(task, workspace, config, transcript=transcript, final_message=final_message)
    client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key, timeout=config.timeout_s, max_retries=0)
    problem, text = "", ""
    for attempt in range(1, config.max_retries + 2):
        try:
            resp = client.chat.completions.create(model=config.model, messages=messages, temperature=config.temperature,
                                                  max_tokens=config.max_tokens)
            text = resp.choices[0].message.content or ""
            scores, notes = parse_judge_output(text, task.rubric)
            return RubricResult(aggregate_scores(scores, task.rubric, aggregate), scores, notes, "", text, attempt)
        except JudgeFormatError as e:
            problem = f"answer broke the JSON contract ({e})"
        except openai.OpenAIError as e:
            problem = f"call to {config.base_url} failed ({type(e).__name__}: {str(e)[:200]})"
    return RubricResult(None, {}, "", f"{problem} after {config.max_retries + 1} attempt(s)", text, config.max_retries + 1)
