"""The native task format: one folder per task, loaded into a typed `Task` (docs/tasks.md).

A task is an instruction, a seed workspace and a verifier (paper §2.1). On disk (Harbor-compatible
where it can be: Harbor ignores our extra keys and folders):

    <task_id>/
      task.toml          [metadata] [agent] [verifier] [verifier.weights] [environment] [claw]
      instruction.md     the exact first user message
      workspace/         seed files copied into a fresh sandbox (optional: absent = empty)
      tests/             hidden until the harness has finished
        check.py         code checks: `python3 check.py WORKSPACE` prints a JSON dict name -> [0, 1]
        test.sh          or a Harbor verifier writing /logs/verifier/reward.{txt,json}
        rubric.md        optional rubric for the LLM judge (see `rubric.py`)
      environment/       optional Dockerfile (Harbor)
      solution/solve.sh  optional oracle

Everything a user can get wrong raises `UserError` naming the task folder and the field. Paths
inside the folder must stay inside it: no `..`, no absolute paths, no symlinks leading out.
"""

from __future__ import annotations

import os
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from clawgym.errors import UserError
from clawgym.tasks.rubric import Rubric, parse_rubric

TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# What a task may need beyond files + python3; `clawgym tasks validate` counts tasks by these.
NEEDS = ("network", "browser", "judge", "binary", "docker", "services", "transcript", "sessions")
VERIFIER_KINDS = ("check", "harbor", "none")
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Session:
    """One user turn of a multi-session task (PinchBench `sessions`)."""

    name: str
    instruction: str
    new_session: bool = False
    """start a fresh conversation on the same workspace"""


@dataclass
class Task:
    """A loaded, validated task folder. Paths are absolute; the folder itself is never modified."""

    id: str
    path: Path
    instruction: str
    category: str = ""
    source: str = ""
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    verifier_kind: str = "check"
    """check (tests/check.py) | harbor (tests/test.sh) | none (rubric only)"""
    code_weight: float = 1.0
    rubric_weight: float = 0.0
    gate: float = 0.0
    """the rubric counts only when the code score reaches this (QwenClawBench-style gate)"""
    noop_score: float | None = None
    """code score of the untouched workspace, as recorded at import/validation"""
    needs: frozenset[str] = frozenset()
    """declared needs ([claw] needs), see NEEDS"""
    tools: tuple[str, ...] = ()
    """executables the checks call (git, pytest, ...)"""
    allow_internet: bool = False
    docker_image: str = ""
    workdir: str = "/app"
    """where Harbor tests expect the workspace (container path)"""
    memory_mb: int | None = None
    cpus: float | None = None
    rubric: Rubric | None = None
    sessions: tuple[Session, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def workspace_dir(self) -> Path:
        return self.path / "workspace"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def has_code_checks(self) -> bool:
        return self.verifier_kind in ("check", "harbor")

    @property
    def group_key(self) -> str:
        return self.id

    def flags(self) -> set[str]:
        """Declared needs plus what the folder shows: a judge for a weighted rubric, binary seeds, ..."""
        out = set(self.needs)
        if self.rubric is not None and self.rubric_weight > 0:
            out.add("judge")
        if self.allow_internet:
            out.add("network")
        if (self.path / "environment" / "Dockerfile").is_file() or self.docker_image:
            out.add("docker")
        if len(self.sessions) > 1:
            out.add("sessions")
        if self.workspace_dir.is_dir() and any(is_binary_file(p) for p in self.workspace_dir.rglob("*") if p.is_file()):
            out.add("binary")
        return out

    def materialize(self, dest: str | os.PathLike) -> Path:
        """Copy the seed workspace into `dest` (created if absent; must be empty). Returns `dest`."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        if any(dest.iterdir()):
            raise UserError(f"{dest}: the workspace destination must be empty")
        if self.workspace_dir.is_dir():
            shutil.copytree(self.workspace_dir, dest, symlinks=True, dirs_exist_ok=True)
        return dest


# ---------------------------------------------------------------------------------------------
# Path safety
# ---------------------------------------------------------------------------------------------


def safe_relpath(value: str, where: str) -> PurePosixPath:
    """A relative path that stays inside its folder, or UserError naming `where`."""
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: expected a relative path, got {value!r}")
    p = PurePosixPath(value.replace("\\", "/"))
    if p.is_absolute() or value.startswith("~") or re.match(r"^[A-Za-z]:", value):
        raise UserError(f"{where}: absolute path {value!r} is not allowed; use a path relative to the folder")
    if any(part == ".." for part in p.parts):
        raise UserError(f"{where}: path {value!r} leaves its folder ('..' is not allowed)")
    return p


def safe_join(root: Path, value: str, where: str) -> Path:
    """`root / value` after checking `value` with `safe_relpath`."""
    return root.joinpath(*safe_relpath(value, where).parts)


def check_tree(root: Path, label: str) -> None:
    """Reject symlinks under `root` that point outside `task_root` (or dangle)."""
    base = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                target = p.resolve()
                if not target.exists() or not target.is_relative_to(base):
                    rel = p.relative_to(root)
                    raise UserError(f"{label}: symlink '{rel}' points outside the task folder ({os.readlink(p)})")


def read_text(path: Path, where: str | None = None) -> str:
    """The UTF-8 text of `path`, or UserError naming it (not UTF-8, unreadable)."""
    where = where or str(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    except OSError as e:
        raise UserError(f"{where}: cannot be read ({e.strerror or e})") from None


BINARY_SUFFIXES = {".pdf", ".xlsx", ".xls", ".docx", ".doc", ".pptx", ".ppt", ".png", ".jpg", ".jpeg", ".gif", ".webp",
                   ".bmp", ".zip", ".gz", ".tar", ".mp3", ".mp4", ".wav", ".sqlite", ".db", ".parquet", ".pkl"}


def is_binary_file(p: Path) -> bool:
    """A file a text-only model cannot read as text: by its suffix (even a stub) or its bytes."""
    if p.suffix.lower() in BINARY_SUFFIXES:
        return True
    with open(p, "rb") as f:
        head = f.read(4096)
    if b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(head) - 4  # a multi-byte char cut at the 4 KiB boundary is still text
    return False


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def _get(table: dict, key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    if key not in table:
        return default
    v = table[key]
    if kind in (float, (int, float)) and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is not bool):
        name = kind.__name__ if isinstance(kind, type) else "number"
        raise UserError(f"{where}: field '{key}' must be a {name}, got {v!r}")
    return v


def _table(doc: dict, key: str, where: str) -> dict:
    v = doc.get(key, {})
    if not isinstance(v, dict):
        raise UserError(f"{where}: [{key}] must be a table")
    return v


def _strict(table: dict, allowed: set[str], where: str) -> None:
    unknown = set(table) - allowed
    if unknown:
        raise UserError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {', '.join(sorted(allowed))}")


def _claw_section(claw: dict, w: str) -> tuple[list, list, list[Session]]:
    """[claw]: the task's needs, tools and follow-up sessions, checked."""
    _strict(claw, {"needs", "tools", "sessions", "transcript_format"}, f"{w} [claw]")
    needs = _get(claw, "needs", list, f"{w} [claw]", [])
    bad = [n for n in needs if n not in NEEDS]
    if bad:
        raise UserError(f"{w} [claw]: field 'needs' has unknown value(s) {bad}; allowed: {', '.join(NEEDS)}")
    tools = _get(claw, "tools", list, f"{w} [claw]", [])
    sessions = []
    for i, s in enumerate(_get(claw, "sessions", list, f"{w} [claw]", [])):
        sw = f"{w} [[claw.sessions]] #{i + 1}"
        if not isinstance(s, dict):
            raise UserError(f"{sw}: must be a table")
        _strict(s, {"name", "instruction", "new_session"}, sw)
        text = _get(s, "instruction", str, sw)
        if not text or not text.strip():
            raise UserError(f"{sw}: field 'instruction' is missing or empty")
        sessions.append(Session(_get(s, "name", str, sw, f"session_{i + 1}"), text, _get(s, "new_session", bool, sw, False)))
    return needs, tools, sessions


def _scoring(root: Path, verifier: dict, label: str, w: str) -> tuple[str, Rubric | None, float, float, float, float | None]:
    """[verifier] and tests/: the check's kind, the rubric, the code and rubric weights (before
    normalizing), the gate and the no-op baseline, each checked against what the folder holds."""
    kind_default = "check" if (root / "tests" / "check.py").is_file() else "harbor" if (root / "tests" / "test.sh").is_file() else "none"
    _strict(verifier, {"timeout_sec", "kind", "weights", "baseline", "env", "user"}, f"{w} [verifier]")
    kind = _get(verifier, "kind", str, f"{w} [verifier]", kind_default)
    if kind not in VERIFIER_KINDS:
        raise UserError(f"{w} [verifier]: field 'kind' is {kind!r}; allowed: {', '.join(VERIFIER_KINDS)}")
    entry = {"check": "tests/check.py", "harbor": "tests/test.sh"}.get(kind)
    if entry and not (root / entry).is_file():
        raise UserError(f"{w} [verifier]: kind '{kind}' needs {entry}, which is missing")

    rubric = None
    rubric_path = root / "tests" / "rubric.md"
    if rubric_path.is_file():
        rubric = parse_rubric(read_text(rubric_path, f"{label}/tests/rubric.md"), f"{label}/tests/rubric.md")
        for c in rubric.criteria:
            for f in c.files:
                safe_relpath(f, f"{label}/tests/rubric.md: criterion '{c.name}' Files")

    weights = _get(verifier, "weights", dict, f"{w} [verifier]", {})
    ww = f"{w} [verifier.weights]"
    _strict(weights, {"code", "rubric", "gate"}, ww)
    has_code, has_rubric = kind != "none", rubric is not None
    dc, dr = (0.7, 0.3) if has_code and has_rubric else (1.0, 0.0) if has_code else (0.0, 1.0)
    code_w = _get(weights, "code", (int, float), ww, dc)
    rubric_w = _get(weights, "rubric", (int, float), ww, dr)
    gate = _get(weights, "gate", (int, float), ww, 0.0)
    if code_w < 0 or rubric_w < 0 or code_w + rubric_w <= 0:
        raise UserError(f"{ww}: 'code' and 'rubric' must be >= 0 with a positive sum (got {code_w}, {rubric_w})")
    if code_w > 0 and not has_code:
        raise UserError(f"{ww}: 'code' is {code_w} but the task has no code checks (tests/check.py or tests/test.sh)")
    if rubric_w > 0 and not has_rubric:
        raise UserError(f"{ww}: 'rubric' is {rubric_w} but the task has no tests/rubric.md")
    if not 0 <= gate <= 1:
        raise UserError(f"{ww}: 'gate' must be in [0, 1], got {gate}")
    baseline = _get(verifier, "baseline", dict, f"{w} [verifier]", {})
    noop = _get(baseline, "noop", (int, float), f"{w} [verifier.baseline]", None)
    return kind, rubric, code_w, rubric_w, gate, noop


def load_task(path: str | os.PathLike) -> Task:
    """Load and validate one native task folder."""
    root = Path(path).absolute()
    label = str(root)
    if not root.is_dir():
        raise UserError(f"{label}: not a task folder (no such directory)")
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise UserError(f"{label}: missing task.toml")
    check_tree(root, label)  # before reading anything: task.toml itself may be a link leading out
    try:
        doc = tomllib.loads(read_text(toml_path, f"{label}/task.toml"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{label}/task.toml: not valid TOML ({e})") from None

    meta = _table(doc, "metadata", f"{label}/task.toml")
    agent = _table(doc, "agent", f"{label}/task.toml")
    verifier = _table(doc, "verifier", f"{label}/task.toml")
    env = _table(doc, "environment", f"{label}/task.toml")
    claw = _table(doc, "claw", f"{label}/task.toml")
    w = f"{label}/task.toml"

    task_id = _get(meta, "id", str, f"{w} [metadata]", root.name)
    if not TASK_ID_RE.match(task_id):
        raise UserError(f"{w} [metadata]: field 'id' {task_id!r} must match {TASK_ID_RE.pattern}")

    instr_path = root / "instruction.md"
    if not instr_path.is_file():
        raise UserError(f"{label}: missing instruction.md")
    instruction = read_text(instr_path, f"{label}/instruction.md")
    if not instruction.strip():
        raise UserError(f"{label}/instruction.md: is empty")

    needs, tools, sessions = _claw_section(claw, w)

    kind, rubric, code_w, rubric_w, gate, noop = _scoring(root, verifier, label, w)

    agent_t = _get(agent, "timeout_sec", (int, float), f"{w} [agent]", DEFAULT_AGENT_TIMEOUT_S)
    ver_t = _get(verifier, "timeout_sec", (int, float), f"{w} [verifier]", DEFAULT_VERIFIER_TIMEOUT_S)
    for name, t in (("[agent] timeout_sec", agent_t), ("[verifier] timeout_sec", ver_t)):
        if t <= 0:
            raise UserError(f"{w}: field {name} must be positive, got {t}")
    workdir = _get(env, "workdir", str, f"{w} [environment]", "/app")
    memory = _get(env, "memory_mb", int, f"{w} [environment]", None)
    cpus = _get(env, "cpus", (int, float), f"{w} [environment]", None)

    return Task(
        id=task_id,
        path=root,
        instruction=instruction,
        category=str(meta.get("category", "")),
        source=str(meta.get("source", "")),
        agent_timeout_s=float(agent_t),
        verifier_timeout_s=float(ver_t),
        verifier_kind=kind,
        code_weight=code_w / (code_w + rubric_w),
        rubric_weight=rubric_w / (code_w + rubric_w),
        gate=float(gate),
        noop_score=noop,
        needs=frozenset(needs),
        tools=tuple(str(t) for t in tools),
        allow_internet=_get(env, "allow_internet", bool, f"{w} [environment]", False),
        docker_image=_get(env, "docker_image", str, f"{w} [environment]", ""),
        workdir=workdir,
        memory_mb=memory,
        cpus=cpus,
        rubric=rubric,
        sessions=tuple(sessions),
        metadata=dict(meta),
    )


def find_task_dirs(path: str | os.PathLike) -> list[Path]:
    """`path` itself if it is a task folder, else its sub-folders holding a task.toml (sorted)."""
    root = Path(path)
    if not root.is_dir():
        raise UserError(f"{root}: no such directory")
    if (root / "task.toml").is_file():
        return [root]
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / "task.toml").is_file())
    if not dirs:
        raise UserError(f"{root}: holds no task folders (no */task.toml)")
    return dirs


def load_tasks(path: str | os.PathLike) -> list[Task]:
    """Every task under `path`; the first invalid one raises. Duplicate ids are an error."""
    tasks = [load_task(d) for d in find_task_dirs(path)]
    seen: dict[str, Path] = {}
    for t in tasks:
        if t.id in seen:
            raise UserError(f"{t.path}: task id '{t.id}' is also used by {seen[t.id]}")
        seen[t.id] = t.path
    return tasks
