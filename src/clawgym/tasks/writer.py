"""Writing native task folders: a small TOML emitter and an atomic per-task folder writer.

Importers build a `TaskDraft` (everything a task folder holds, in memory or as files to copy) and
`write_task` puts it on disk: into a hidden temp folder next to the destination first, then one
rename, so an interrupted import never leaves half a task that `load_task` would accept.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawgym.errors import UserError
from clawgym.tasks.spec import check_tree, load_task, safe_join, Task


@dataclass
class TaskDraft:
    """A task folder to write. Paths in the dicts are relative to the folder's parts."""

    id: str
    instruction: str
    toml: dict[str, Any]
    """task.toml as nested dicts; lists of dicts become arrays of tables"""
    workspace_text: dict[str, str] = field(default_factory=dict)
    workspace_copy: dict[str, Path] = field(default_factory=dict)
    """relative dest -> source file or folder to copy into workspace/"""
    tests_text: dict[str, str] = field(default_factory=dict)
    tests_copy: dict[str, Path] = field(default_factory=dict)
    extra_copy: dict[str, Path] = field(default_factory=dict)
    """other folders copied as they are (environment/, solution/)"""


# ---------------------------------------------------------------------------------------------
# TOML
# ---------------------------------------------------------------------------------------------


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{where}: TOML cannot hold {v}")
        return repr(v)
    if isinstance(v, str):
        # A JSON string (without ASCII escaping) is a valid TOML basic string.
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x, where)}" for k, x in v.items()) + " }"
    raise ValueError(f"{where}: cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def dump_toml(doc: dict[str, Any]) -> str:
    """Nested dicts -> TOML text: scalars first, then [tables], then [[arrays of tables]]."""
    lines: list[str] = []

    def emit(table: dict[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and not _is_aot(v)}
        for k, v in scalars.items():
            if v is not None:
                lines.append(f"{_key(k)} = {_value(v, prefix + k)}")
        for k, v in table.items():
            if isinstance(v, dict):
                name = f"{prefix}{_key(k)}"
                lines.extend(["", f"[{name}]"])
                emit(v, name + ".")
        for k, v in table.items():
            if _is_aot(v):
                name = f"{prefix}{_key(k)}"
                for item in v:
                    lines.extend(["", f"[[{name}]]"])
                    emit(item, name + ".")

    emit(doc, "")
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_aot(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


# ---------------------------------------------------------------------------------------------
# Folder writing
# ---------------------------------------------------------------------------------------------


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        # Links are copied as the files they point to (the imported task carries no link), so a
        # link leading out of the copied folder would copy outside files in (a host's secrets, or
        # the hidden tests into the workspace): refuse it.
        check_tree(src, str(src))
        shutil.copytree(src, dest, symlinks=False, dirs_exist_ok=True)
    else:
        if src.is_symlink() and not src.resolve().is_relative_to(src.parent.resolve()):
            raise UserError(f"{src}: symlink points outside its folder ({os.readlink(src)})")
        shutil.copyfile(src, dest)


def write_task(draft: TaskDraft, dst_root: Path, *, force: bool = False) -> Task:
    """Write `draft` to `dst_root/<id>` atomically and return it loaded (so it is valid)."""
    final = dst_root / draft.id
    if final.exists() and not force:
        raise UserError(f"{final}: already exists (pass --force to overwrite)")
    try:
        toml_text = dump_toml(draft.toml)
    except ValueError as e:  # a value TOML cannot hold (NaN, a date a source carried along)
        raise UserError(f"{draft.id}: task.toml: {e}") from None
    try:
        dst_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{draft.id}.", dir=dst_root))
    except OSError as e:
        raise UserError(f"{dst_root}: cannot write a task folder here ({e.strerror or e})") from None
    try:
        _fill(tmp, draft, toml_text)
        load_task(tmp)  # validate before it becomes visible
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except (OSError, UnicodeError) as e:  # a full disk, or text with lone surrogates from a source's JSON
        shutil.rmtree(tmp, ignore_errors=True)
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise UserError(f"{final}: could not be written ({reason}); nothing was left behind") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return load_task(final)


def _fill(tmp: Path, draft: TaskDraft, toml_text: str) -> None:
    """Write every part of `draft` into the (empty) folder `tmp`."""
    (tmp / "task.toml").write_text(toml_text, encoding="utf-8")
    (tmp / "instruction.md").write_text(draft.instruction.rstrip() + "\n", encoding="utf-8")
    ws = tmp / "workspace"
    ws.mkdir()
    for rel, text in draft.workspace_text.items():
        p = safe_join(ws, rel, f"{draft.id}: workspace file")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    for rel, src in draft.workspace_copy.items():
        _copy(src, safe_join(ws, rel, f"{draft.id}: workspace file") if rel else ws)
    tests = tmp / "tests"
    if draft.tests_text or draft.tests_copy:
        tests.mkdir()
    for rel, src in draft.tests_copy.items():
        _copy(src, safe_join(tests, rel, f"{draft.id}: tests file") if rel else tests)
    for rel, text in draft.tests_text.items():
        p = safe_join(tests, rel, f"{draft.id}: tests file")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    for rel, src in draft.extra_copy.items():
        _copy(src, safe_join(tmp, rel, f"{draft.id}: folder"))
    check_tree(tmp, f"{draft.id}")
