"""Rubrics for the LLM judge: a small Markdown format, parsed into typed criteria.

`tests/rubric.md` (hidden from the agent) reads like PinchBench's "LLM Judge Rubric" section:

    Optional preamble: what a good result looks like (given to the judge as context).

    ### Criterion 1: Classification quality (Weight: 35%)
    What this criterion looks at.
    Files: report.md, rules.md
    **Score 1.0**: rules are exact ...
    **Score 0.5**: rules exist but are vague ...
    **Score 0.0**: no rules.

Each `##`–`####` heading starts a criterion. "Criterion N:" and "(Weight: X%)" are optional;
score anchors are optional too (default 0, 0.25, 0.5, 0.75, 1, ClawGym's score options).
"Files:" names the outputs the judge must see for it. A text with no heading is one criterion.
The judge sees criteria as `criterion_1`, `criterion_2`, ... (paper Appendix A).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clawgym.errors import UserError

DEFAULT_ANCHORS = (0.0, 0.25, 0.5, 0.75, 1.0)

_HEADING = re.compile(r"^(#{2,4})\s+(.*\S)\s*$")
_CRITERION_PREFIX = re.compile(r"^criterion\s*\d*\s*[:.)-]\s*", re.I)
_WEIGHT = re.compile(r"\(\s*weight\s*:\s*([0-9]*\.?[0-9]+)\s*(%?)\s*\)", re.I)
_ANCHOR = re.compile(r"^\s*(?:[-*]\s+)?\**\s*score\s*[:=]?\s*([0-9]*\.?[0-9]+)\s*\**\s*[:：\-–]?\s*\**\s*(.*)$", re.I)
_FILES = re.compile(r"^\s*(?:[-*]\s+)?\**files?\**\s*:\s*(.+)$", re.I)


@dataclass(frozen=True)
class Criterion:
    name: str
    description: str
    anchors: tuple[float, ...] = DEFAULT_ANCHORS
    """the scores the judge may give, ascending"""
    anchor_text: dict[float, str] = field(default_factory=dict)
    weight: float = 1.0
    """relative weight; PinchBench and ClawGym average criteria, so aggregation defaults to the mean"""
    files: tuple[str, ...] = ()
    """workspace files the judge must see for this criterion"""


@dataclass(frozen=True)
class Rubric:
    preamble: str
    criteria: tuple[Criterion, ...]

    @property
    def files(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for c in self.criteria:
            for f in c.files:
                seen.setdefault(f, None)
        return tuple(seen)

    def ids(self) -> list[str]:
        return [f"criterion_{i + 1}" for i in range(len(self.criteria))]

    def render(self) -> str:
        """The RUBRIC block of the judge prompt."""
        parts = [self.preamble.strip()] if self.preamble.strip() else []
        for cid, c in zip(self.ids(), self.criteria):
            lines = [f"### {cid}: {c.name}"]
            if c.description.strip():
                lines.append(c.description.strip())
            if c.files:
                lines.append("Files: " + ", ".join(c.files))
            lines.append("Allowed scores: " + ", ".join(_fmt(a) for a in c.anchors))
            for a in sorted(c.anchor_text, reverse=True):
                lines.append(f"- {_fmt(a)}: {c.anchor_text[a]}")
            parts.append("\n".join(lines))
        return "\n\n".join(parts)


def _fmt(x: float) -> str:
    return f"{x:g}"


def parse_rubric(text: str, where: str) -> Rubric:
    """Parse rubric Markdown; UserError names `where` and the criterion at fault."""
    preamble: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            # Fences only wrap whole rubrics in PinchBench files: drop the markers, keep the content.
            continue
        m = _HEADING.match(line)
        if m:
            blocks.append((m.group(2), []))
        elif blocks:
            blocks[-1][1].append(line)
        else:
            preamble.append(line)
    if not blocks:
        body = "\n".join(preamble).strip()
        if not body:
            raise UserError(f"{where}: the rubric is empty")
        return Rubric("", (_criterion("overall", preamble, where),))
    criteria = tuple(_criterion(title, lines, where) for title, lines in blocks)
    names = [c.name for c in criteria]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise UserError(f"{where}: criterion name(s) {sorted(dup)} appear more than once")
    return Rubric("\n".join(preamble).strip(), criteria)


def _criterion(title: str, lines: list[str], where: str) -> Criterion:
    weight = 1.0
    m = _WEIGHT.search(title)
    if m:
        weight = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
        title = _WEIGHT.sub("", title).strip()
    name = _CRITERION_PREFIX.sub("", title).strip() or title.strip()
    desc, anchors, files = [], {}, []
    for line in lines:
        a = _ANCHOR.match(line)
        f = _FILES.match(line)
        if a:
            score = float(a.group(1))
            if not 0.0 <= score <= 1.0:
                raise UserError(f"{where}: criterion '{name}': score anchor {score} is outside [0, 1]")
            anchors[score] = a.group(2).strip()
        elif f:
            files += [x.strip().strip("`") for x in f.group(1).split(",") if x.strip()]
        elif line.strip() not in ("---", "***"):
            desc.append(line)
    if weight <= 0:
        raise UserError(f"{where}: criterion '{name}': weight must be positive")
    description = "\n".join(desc).strip()
    if not description and not anchors:
        raise UserError(f"{where}: criterion '{name}' has no description and no score anchors")
    return Criterion(
        name=name,
        description=description,
        anchors=tuple(sorted(anchors)) if len(anchors) >= 2 else DEFAULT_ANCHORS,
        anchor_text=anchors,
        weight=weight,
        files=tuple(files),
    )


def write_rubric(criteria: list[Criterion], preamble: str = "") -> str:
    """Render criteria back to rubric Markdown (what the importers write)."""
    out = [preamble.strip(), ""] if preamble.strip() else []
    for i, c in enumerate(criteria):
        weight = f" (Weight: {c.weight:g})" if c.weight != 1.0 else ""
        out.append(f"### Criterion {i + 1}: {c.name}{weight}")
        if c.description:
            out.append(c.description)
        if c.files:
            out.append("Files: " + ", ".join(c.files))
        for a in sorted(c.anchor_text, reverse=True):
            out.append(f"**Score {_fmt(a)}**: {c.anchor_text[a]}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"
