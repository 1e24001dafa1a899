"""Reading foreign task sources field by field, answering bad input with a one-line UserError.

Importers read files written by others: text that is not UTF-8, a number given as a word, a
mapping given as a list, a link that leaves the source tree. Each helper here checks one such
thing and names the file and the field in its error, so the importer skips that task with the
reason and the rest of the set still imports (docs/tasks.md, "Importers").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawgym.errors import UserError
from clawgym.tasks.spec import TASK_ID_RE, read_text

# A reason starting with this marks an exception the field checks did not foresee: the importer
# skips that task (the validator reports it invalid) and goes on, and the fuzz test
# (tests/tasks/test_tasks_fuzz.py) fails on it, so each one found gets its own check.
UNEXPECTED = "unexpected error"

__all__ = ["UNEXPECTED", "ImportContext", "read_text", "number", "mapping", "sequence", "check_id", "inside", "one_line"]


def number(value: Any, where: str, *, positive: bool = False) -> float:
    """`value` as a finite float (ints and numeric strings too); UserError naming `where` otherwise."""
    if isinstance(value, bool):
        raise UserError(f"{where} must be a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where} must be a number, got {_short(value)}") from None
    if not math.isfinite(out) or (positive and out <= 0) or out < 0:
        raise UserError(f"{where} must be a {'positive' if positive else 'non-negative'} finite number, got {_short(value)}")
    return out


def mapping(value: Any, where: str) -> dict:
    """`value` when it is a mapping (None counts as empty), else UserError naming `where`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where} must be a mapping, got {type(value).__name__} {_short(value)}")
    return value


def sequence(value: Any, where: str) -> list:
    """`value` when it is a list (None counts as empty), else UserError naming `where`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise UserError(f"{where} must be a list, got {type(value).__name__} {_short(value)}")
    return value


def check_id(task_id: Any, where: str) -> str:
    """A task id that `load_task` will accept, else UserError naming `where`."""
    if not isinstance(task_id, str) or not TASK_ID_RE.match(task_id):
        raise UserError(f"{where}: task id {_short(task_id)} must match {TASK_ID_RE.pattern}")
    return task_id


def inside(path: Path, root: Path, where: str) -> Path:
    """`path` after checking that it (links followed) stays inside `root`; UserError otherwise."""
    target = path.resolve()
    if not target.is_relative_to(root.resolve()):
        raise UserError(f"{where}: {path} leads outside {root} (to {target}); links that leave the source tree are refused")
    return path


def one_line(error: object) -> str:
    """An error's text on one line (YAML errors span several, with a caret under the spot)."""
    return " ".join(str(error).split())


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass
class ImportContext:
    """What an importer gets beside the source path: the user's options, and where it notes
    set-level problems that skip no task (a bad manifest: categories come from each task)."""

    assets: Path | None = None
    """an assets root the user named (PinchBench `--assets`): trusted even where it is a link"""
    notes: list[tuple[str, str]] = field(default_factory=list)
    """(source item, what was wrong and what was done instead)"""
