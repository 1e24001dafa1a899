"""The stages' only shared vocabulary: typed rows, their Parquet schemas, and safe readers/writers.

Every stage of clawgym (proxy, rollout, trees, train, eval) exchanges files on disk. This module
defines what those files hold (docs/architecture.md) and how they are written and read:

- `CallRecord`, `RolloutRecord`, `TreeNode`: one dataclass per table row, each with an explicit
  pyarrow schema. Parquet files carry `schema_version` and `kind` in their metadata.
- `write_table` writes atomically (temp file in the same folder, fsync, rename), so a reader never
  sees half a file and a crash never destroys the previous version.
- `read_table` / `read_arrow` validate kind, version and columns and raise one `ArtifactError`
  naming the file and the field.
- `JsonlWriter` appends one record per line and fsyncs each; `read_jsonl` yields every complete
  line of a file whose last line was torn by a crash, and reports the torn one.
- Call prompts may be delta-encoded against an earlier call of the same rollout:
  `prompt_base_call` + `prompt_base_len` + `prompt_ids` (the new tail). `materialize_prompts`
  turns them back into full token ids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Sequence, TypeVar

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1

# Allowed values of the enumerated string fields; readers check them.
PROTOCOLS = ("anthropic", "openai-chat", "openai-responses", "direct")
CALL_STATUSES = ("ok", "engine_error", "client_error", "cancelled")
CALL_ROLES = ("main", "subagent", "compaction", "aux")
ROLLOUT_STATUSES = ("ok", "timeout", "harness_error", "infra_error")
NODE_KINDS = ("model", "env")
METRIC_PREFIXES = ("proxy/", "rollout/", "trees/", "train/", "eval/", "time/")


class ArtifactError(Exception):
    """A file that does not hold what its kind promises. The message names file and field."""

    def __init__(self, path: str | os.PathLike, field: str | None, problem: str):
        self.path, self.field, self.problem = str(path), field, problem
        where = f"{self.path}: field '{field}'" if field else self.path
        super().__init__(f"{where}: {problem}")


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


@dataclass
class CallRecord:
    """One model call as the proxy served it (docs/architecture.md, "calls")."""

    rollout_id: str
    call_id: str
    seq: int
    """arrival order within the rollout, from 0"""
    protocol: str
    """anthropic | openai-chat | openai-responses | direct"""
    model: str
    """the model name the harness asked for"""
    started_at: float
    """unix seconds when the request arrived"""
    finished_at: float
    prompt_ids: list[int]
    """the prompt's token ids; when `prompt_base_call` is set, only the tokens after the shared part"""
    output_ids: list[int]
    """sampled token ids, including the end-of-turn token the model emitted"""
    output_logprobs: list[float]
    """the engine's logprob of each sampled token"""
    finish_reason: str
    """stop | length | tool_calls | error"""
    policy_version: int
    prompt_base_call: str | None = None
    """call_id of an earlier call of the same rollout this prompt is delta-encoded against"""
    prompt_base_len: int = 0
    """how many leading tokens of that call's prompt+output this prompt shares"""
    role: str = "main"
    """main | subagent | compaction | aux, as the harness adapter classified the call"""
    status: str = "ok"
    """ok | engine_error | client_error | cancelled; failed attempts are recorded too"""
    error: str = ""
    stream: bool = False
    tool_names: list[str] = field(default_factory=list)
    system_hash: str = ""
    """sha256 prefix of the system prompt text; equal hashes mean the same system prompt"""
    sampling_json: str = "{}"
    """sampling parameters the request asked for (temperature, top_p, max_tokens, ...), as JSON"""
    render_mode: str = "full"
    """incremental | full: how the proxy rendered this prompt"""
    normalized_json: str = "{}"
    """request text the proxy rewrote before tokenizing, as sent: {what: original} as JSON (e.g.
    Claude Code's per-run billing-line fingerprint, docs/harnesses.md)"""

    KIND: ClassVar[str] = "calls"
    SCHEMA: ClassVar[pa.Schema]

    @property
    def is_delta(self) -> bool:
        return self.prompt_base_call is not None


@dataclass
class RolloutRecord:
    """One rollout: a harness solving one task once (docs/architecture.md, "rollouts")."""

    rollout_id: str
    task_id: str
    harness: str
    group_id: str
    """task_id + harness: the GRPO group"""
    sample_index: int
    status: str
    """ok | timeout | harness_error | infra_error"""
    reward: float | None
    """null when excluded (infra_error)"""
    n_calls: int
    wall_time_s: float
    policy_version: int
    code_score: float | None = None
    rubric_score: float | None = None
    code_weight: float = 1.0
    rubric_weight: float = 0.0
    subscores_json: str = "{}"
    """named sub-scores of the verifier, as JSON"""
    category: str = ""
    """the task's category, for per-category tables"""
    step: int = 0
    error: str = ""
    node: str = ""
    """where it ran: the host name, and under --ray the Ray node id (host/ray:ID)"""

    KIND: ClassVar[str] = "rollouts"
    SCHEMA: ClassVar[pa.Schema]

    @property
    def trainable(self) -> bool:
        return self.status != "infra_error" and self.reward is not None


@dataclass
class TreeNode:
    """One node of a rollout's prefix tree over token ids (docs/architecture.md, "trees")."""

    rollout_id: str
    node_id: int
    parent_id: int
    """-1 for a root"""
    token_ids: list[int]
    kind: str
    """model (sampled by the policy) | env (prompt text: system, user, tool output, harness text)"""
    logprobs: list[float]
    """the rollout engine's logprobs for model tokens; empty for env nodes"""
    call_id: str
    """the call that created the node"""
    segment: int
    """index of the segment between compaction points"""
    role: str
    """main | subagent | compaction | aux"""
    kept: bool
    """survived filtering (and so is trainable when kind is model and role is main)"""
    depth: int
    """position of the node's first token on its root-to-leaf path"""
    drop_reason: str = ""
    """why not kept: dead_leaf | failed_call | over_branching | aux | subagent | compaction | excluded_rollout"""

    KIND: ClassVar[str] = "trees"
    SCHEMA: ClassVar[pa.Schema]

    @property
    def trainable(self) -> bool:
        return self.kept and self.kind == "model" and self.role == "main"


@dataclass
class TranscriptToolCall:
    """One tool call the agent made, with its arguments (a dict, or the raw string when not a JSON object)."""

    id: str
    name: str
    arguments: Any


@dataclass
class TranscriptMessage:
    """One message of a rollout's normalized transcript (docs/architecture.md, "transcripts.jsonl")."""

    role: str
    """user | assistant | tool"""
    text: str = ""
    tool_calls: list[TranscriptToolCall] = field(default_factory=list)
    """assistant: the tool calls of this turn"""
    tool_call_id: str = ""
    """tool: the call this result answers"""
    tool_name: str = ""
    """tool: the name of that call, when known"""
    reasoning: str = ""
    """assistant: the model's thinking, when the harness or the proxy saw it"""


@dataclass
class Transcript:
    """What the agent did in one rollout: one line of transcripts.jsonl (system prompts left out)."""

    rollout_id: str = ""
    harness: str = ""
    source: str = "none"
    """proxy | claude-code-stream-json | codex-json | none: what it was built from"""
    final_answer: str | None = None
    messages: list[TranscriptMessage] = field(default_factory=list)

    KIND: ClassVar[str] = "transcripts"
    SOURCES: ClassVar[tuple[str, ...]] = ("proxy", "claude-code-stream-json", "codex-json", "none")

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": self.KIND, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, rec: dict, path: str | os.PathLike = "<transcripts>") -> "Transcript":
        """Validate one line of transcripts.jsonl; the error names the file and the field."""
        if rec.get("kind") != cls.KIND:
            raise ArtifactError(path, "kind", f"is {rec.get('kind')!r}, expected '{cls.KIND}'")
        if rec.get("schema_version") != SCHEMA_VERSION:
            raise ArtifactError(path, "schema_version", f"is {rec.get('schema_version')!r}, this clawgym reads version {SCHEMA_VERSION}")
        if rec.get("source") not in cls.SOURCES:
            raise ArtifactError(path, "source", f"unknown value {rec.get('source')!r}; allowed: {', '.join(cls.SOURCES)}")
        msgs = rec.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and m.get("role") in ("user", "assistant", "tool") for m in msgs):
            raise ArtifactError(path, "messages", f"of rollout {rec.get('rollout_id')!r} must be a list of user/assistant/tool messages")
        try:
            messages = [TranscriptMessage(**{**m, "tool_calls": [TranscriptToolCall(**c) for c in m.get("tool_calls") or []]})
                        for m in msgs]
        except TypeError as e:
            raise ArtifactError(path, "messages", f"of rollout {rec.get('rollout_id')!r}: {e}") from None
        return cls(str(rec.get("rollout_id", "")), str(rec.get("harness", "")), rec["source"], rec.get("final_answer"), messages)


def read_transcripts(path: str | os.PathLike) -> dict[str, Transcript]:
    """transcripts.jsonl -> {rollout id: transcript}; a rerun rollout's last line wins (as in results.jsonl)."""
    return {t.rollout_id: t for t in (Transcript.from_json(r, path) for r in read_jsonl(path).records)}


CallRecord.SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("call_id", pa.string()),
        ("seq", pa.int64()),
        ("protocol", pa.string()),
        ("model", pa.string()),
        ("started_at", pa.float64()),
        ("finished_at", pa.float64()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("output_ids", pa.list_(pa.int32())),
        ("output_logprobs", pa.list_(pa.float32())),
        ("finish_reason", pa.string()),
        ("policy_version", pa.int64()),
        ("prompt_base_call", pa.string()),
        ("prompt_base_len", pa.int64()),
        ("role", pa.string()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("stream", pa.bool_()),
        ("tool_names", pa.list_(pa.string())),
        ("system_hash", pa.string()),
        ("sampling_json", pa.string()),
        ("render_mode", pa.string()),
        ("normalized_json", pa.string()),
    ]
)

RolloutRecord.SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("harness", pa.string()),
        ("group_id", pa.string()),
        ("sample_index", pa.int64()),
        ("status", pa.string()),
        ("reward", pa.float64()),
        ("n_calls", pa.int64()),
        ("wall_time_s", pa.float64()),
        ("policy_version", pa.int64()),
        ("code_score", pa.float64()),
        ("rubric_score", pa.float64()),
        ("code_weight", pa.float64()),
        ("rubric_weight", pa.float64()),
        ("subscores_json", pa.string()),
        ("category", pa.string()),
        ("step", pa.int64()),
        ("error", pa.string()),
        ("node", pa.string()),
    ]
)

TreeNode.SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("node_id", pa.int64()),
        ("parent_id", pa.int64()),
        ("token_ids", pa.list_(pa.int32())),
        ("kind", pa.string()),
        ("logprobs", pa.list_(pa.float32())),
        ("call_id", pa.string()),
        ("segment", pa.int64()),
        ("role", pa.string()),
        ("kept", pa.bool_()),
        ("depth", pa.int64()),
        ("drop_reason", pa.string()),
    ]
)

Row = TypeVar("Row", CallRecord, RolloutRecord, TreeNode)
ROW_TYPES: dict[str, type] = {t.KIND: t for t in (CallRecord, RolloutRecord, TreeNode)}

# Enumerated fields checked by readers: (row type, field) -> allowed values.
_ENUMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("calls", "protocol"): PROTOCOLS,
    ("calls", "status"): CALL_STATUSES,
    ("calls", "role"): CALL_ROLES,
    ("rollouts", "status"): ROLLOUT_STATUSES,
    ("trees", "kind"): NODE_KINDS,
    ("trees", "role"): CALL_ROLES,
}

# Fields a Parquet file may lack and still be read (filled with the dataclass default), so that
# optional columns added later do not break reading older files of the same schema version.
_REQUIRED = {
    kind: {f.name for f in dataclasses.fields(t) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    for kind, t in ROW_TYPES.items()
}


# ---------------------------------------------------------------------------------------------
# Atomic file writing
# ---------------------------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def process_umask() -> int:
    """The process umask, read without changing it where Linux shows it (os.umask sets as it reads,
    which another thread could see), else by the set-and-restore."""
    try:
        line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("Umask:"))
        return int(line.split()[1], 8)
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def umask_modes(path: str | os.PathLike) -> None:
    """Give a file or a directory tree made by mkstemp/mkdtemp (0600/0700, private) the modes an
    ordinary open() or mkdir() would: 0666/0777 less the umask, so output shared on a cluster
    filesystem is readable as the user's other files are."""
    path = Path(path)
    mask = process_umask()
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask_modes(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


SECRET_KEYS = frozenset({"api_key", "admin_token", "token", "hf_token", "access_token", "auth_token", "bearer_token",
                         "secret", "client_secret", "password", "authorization", "wandb_api_key"})
"""the config keys whose values are credentials, by exact name (any case): a key that merely mentions
tokens (max_tokens, token_budget) is a setting and is kept"""


def redact(value: Any) -> Any:
    """A copy with the values of the keys in SECRET_KEYS replaced: configs are shared and committed,
    credentials must never be."""
    if isinstance(value, dict):
        return {k: "<redacted>" if v and str(k).lower() in SECRET_KEYS else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def write_config(path: str | os.PathLike, config: Any) -> Path:
    """Record the resolved config of a stage next to its output (JSON; dataclasses welcome; secrets redacted)."""
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    return atomic_write_bytes(path, orjson.dumps(redact(config), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str))


# ---------------------------------------------------------------------------------------------
# Parquet tables
# ---------------------------------------------------------------------------------------------


def to_arrow(rows: Sequence[Row], row_type: type[Row]) -> pa.Table:
    """Rows -> a pyarrow Table with the row type's schema and metadata."""
    names = row_type.SCHEMA.names
    columns = {n: [getattr(r, n) for r in rows] for n in names}
    table = pa.table(columns, schema=row_type.SCHEMA)
    return table.replace_schema_metadata({"schema_version": str(SCHEMA_VERSION), "kind": row_type.KIND})


def write_table(path: str | os.PathLike, rows: Sequence[Row] | pa.Table, row_type: type[Row]) -> Path:
    """Write rows (or a Table of the row type's schema) to Parquet, atomically."""
    path = Path(path)
    if isinstance(rows, pa.Table):
        table = rows.cast(row_type.SCHEMA).replace_schema_metadata(
            {"schema_version": str(SCHEMA_VERSION), "kind": row_type.KIND}
        )
    else:
        table = to_arrow(rows, row_type)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask_modes(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        # pyarrow's IO errors carry no errno, only the OS message
        if isinstance(e, OSError) and (e.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e)):
            raise ArtifactError(path, None, "could not be written: no space left on device; "
                                            "any previous file is unchanged") from e
        raise
    _fsync_dir(path.parent)
    return path


def read_arrow(path: str | os.PathLike, row_type: type[Row]) -> pa.Table:
    """Read and validate a Parquet artifact; returns a Table with every column of the schema."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(path, None, f"no such file (expected a {row_type.KIND} table)")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a non-Parquet file
        raise ArtifactError(path, None, f"not a readable Parquet file ({e})") from None
    meta = {k.decode(): v.decode() for k, v in (pf.schema_arrow.metadata or {}).items()}
    kind = meta.get("kind")
    if kind is not None and kind != row_type.KIND:
        raise ArtifactError(path, "kind", f"holds a '{kind}' table, expected '{row_type.KIND}'")
    version = meta.get("schema_version")
    if version is None:
        raise ArtifactError(path, "schema_version", "missing from the file metadata (not written by clawgym?)")
    if version != str(SCHEMA_VERSION):
        raise ArtifactError(path, "schema_version", f"is {version}, this clawgym reads version {SCHEMA_VERSION}")
    table = pf.read()
    present = set(table.column_names)
    for name in row_type.SCHEMA.names:
        if name not in present:
            if name in _REQUIRED[row_type.KIND]:
                raise ArtifactError(path, name, "missing column")
            default = _field_default(row_type, name)
            table = table.append_column(
                row_type.SCHEMA.field(name), pa.array([default] * table.num_rows, type=row_type.SCHEMA.field(name).type)
            )
    table = table.select(row_type.SCHEMA.names)
    try:
        table = table.cast(row_type.SCHEMA.with_metadata(table.schema.metadata))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        bad = next(
            (f.name for f in row_type.SCHEMA if not table.schema.field(f.name).type.equals(f.type)), None
        )
        raise ArtifactError(path, bad, f"has the wrong type ({e})") from None
    for (k, name), allowed in _ENUMS.items():
        if k == row_type.KIND:
            values = set(table.column(name).unique().to_pylist())
            bad_values = values - set(allowed)
            if bad_values:
                raise ArtifactError(path, name, f"unknown value(s) {sorted(map(str, bad_values))}; allowed: {', '.join(allowed)}")
    for name in _REQUIRED[row_type.KIND]:
        if row_type.SCHEMA.field(name).type in (pa.string(), pa.int64()) and name != "reward":
            if table.column(name).null_count:
                raise ArtifactError(path, name, "has null values")
    return table


def _field_default(row_type: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(row_type) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def read_table(path: str | os.PathLike, row_type: type[Row]) -> list[Row]:
    """Read and validate a Parquet artifact into typed rows."""
    return read_table_rows(read_arrow(path, row_type), row_type)


def read_table_rows(table: pa.Table, row_type: type[Row]) -> list[Row]:
    """Typed rows from a Table that `read_arrow` validated (or a filtered slice of one)."""
    return [row_type(**d) for d in table.to_pylist()]


def file_kind(path: str | os.PathLike) -> str | None:
    """The `kind` a clawgym Parquet file declares in its metadata, or None."""
    meta = pq.read_schema(path).metadata or {}
    kind = meta.get(b"kind")
    return kind.decode() if kind else None


# ---------------------------------------------------------------------------------------------
# JSONL: append-only logs (call records, metrics, train metrics)
# ---------------------------------------------------------------------------------------------


def _jsonable(record: Any) -> Any:
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.asdict(record)
    return record


class JsonlWriter:
    """Appends one JSON record per line; each append is flushed and fsync'd before returning.

    Opening an existing file whose last line is torn (a crash mid-write) first terminates that
    line, so new records never glue onto it; readers then report it as torn and skip it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab", buffering=0)
        if self._f.tell() > 0:
            with open(self.path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    self._f.write(b"\n")

    def append(self, record: Any) -> int:
        """Append one record; returns the bytes written."""
        line = orjson.dumps(_jsonable(record), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        fd = self._f.fileno()
        start = os.fstat(fd).st_size  # one writer per file: where this line begins
        try:
            view = memoryview(line)
            while view:  # unbuffered: a short write (disk nearly full) is continued, never lost in a buffer
                view = view[self._f.write(view):]
            os.fsync(fd)
        except OSError:
            # Disk full (or another write error) part-way: cut the half line off, so the file keeps
            # only whole records and the next append (once there is room) starts on a clean line.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        return len(line)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class TornLine:
    """A line that could not be parsed: where it is and what it starts with."""

    path: str
    line_no: int
    """1-based line number"""
    text: str
    """its first 80 characters"""
    is_last: bool


@dataclass
class JsonlRead:
    records: list[dict]
    torn: list[TornLine]

    def __iter__(self) -> Iterator[dict]:
        return iter(self.records)


def read_jsonl(path: str | os.PathLike, *, strict: bool = False) -> JsonlRead:
    """Every complete JSON line of `path`, plus a report of lines that are not.

    A torn last line (no newline, or half a record) is the normal result of a crash mid-write and
    is reported, not raised. With `strict`, a broken line anywhere but the last raises
    ArtifactError, since that means the file was damaged rather than cut short.
    """
    path = Path(path)
    if not path.exists():
        raise ArtifactError(path, None, "no such file")
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    records, torn = [], []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        is_last = i == len(lines) - 1
        try:
            rec = orjson.loads(raw)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except (orjson.JSONDecodeError, ValueError):
            text = raw[:80].decode("utf-8", "replace")
            if strict and not is_last:
                raise ArtifactError(path, None, f"line {i + 1} is not a JSON object: {text!r}") from None
            torn.append(TornLine(str(path), i + 1, text, is_last))
            continue
        records.append(rec)
    return JsonlRead(records, torn)


def rows_from_dicts(records: Iterable[dict], row_type: type[Row], path: str | os.PathLike = "<records>") -> list[Row]:
    """Validate JSON records into typed rows; the error names the file, the record and the field."""
    names = {f.name for f in dataclasses.fields(row_type)}
    out = []
    for i, rec in enumerate(records):
        missing = _REQUIRED[row_type.KIND] - rec.keys()
        if missing:
            raise ArtifactError(path, sorted(missing)[0], f"missing in record {i}")
        out.append(row_type(**{k: v for k, v in rec.items() if k in names}))
    return out


# ---------------------------------------------------------------------------------------------
# Metrics lines
# ---------------------------------------------------------------------------------------------


@dataclass
class MetricsLine:
    """One line of metrics.jsonl: a step and namespaced numbers (proxy/ rollout/ trees/ train/ eval/)."""

    step: int
    values: dict[str, float]
    time: float = 0.0

    def __post_init__(self) -> None:
        for key in self.values:
            if not key.startswith(METRIC_PREFIXES):
                raise ValueError(f"metric '{key}' must start with one of {', '.join(METRIC_PREFIXES)}")

    def to_json(self) -> dict:
        return {"step": self.step, "time": self.time, **self.values}

    @classmethod
    def from_json(cls, rec: dict, path: str | os.PathLike = "<metrics>") -> "MetricsLine":
        if "step" not in rec:
            raise ArtifactError(path, "step", "missing in metrics line")
        values = {k: v for k, v in rec.items() if k not in ("step", "time")}
        try:
            return cls(int(rec["step"]), values, float(rec.get("time", 0.0)))
        except ValueError as e:
            raise ArtifactError(path, None, str(e)) from None


def append_metrics(path: str | os.PathLike, line: MetricsLine) -> None:
    with JsonlWriter(path) as w:
        w.append(line.to_json())


def read_metrics(path: str | os.PathLike) -> list[MetricsLine]:
    return [MetricsLine.from_json(r, path) for r in read_jsonl(path).records]


# ---------------------------------------------------------------------------------------------
# Delta-encoded prompts
# ---------------------------------------------------------------------------------------------


def delta_against(call: CallRecord, base: CallRecord | None, base_seq: Sequence[int] = ()) -> CallRecord:
    """Store `call`'s full prompt as a tail after the prefix it shares with `base_seq`.

    `base_seq` is the base call's full prompt followed by its output; the proxy passes the
    conversation a request extends. With no base or under 16 shared tokens the prompt stays full.
    """
    prompt = list(call.prompt_ids)
    n = common_prefix(base_seq, prompt) if base is not None else 0
    if base is None or n < MIN_SHARED_PREFIX:
        return dataclasses.replace(call, prompt_base_call=None, prompt_base_len=0)
    return dataclasses.replace(call, prompt_ids=prompt[n:], prompt_base_call=base.call_id, prompt_base_len=n)


def delta_encode_calls(calls: Sequence[CallRecord]) -> list[CallRecord]:
    """Delta-encode full-prompt calls, each against the earlier call of its rollout it shares most with."""
    out: list[CallRecord] = []
    seen: dict[str, list[tuple[CallRecord, list[int]]]] = {}
    for c in sorted(calls, key=lambda c: (c.rollout_id, c.seq)):
        earlier = seen.setdefault(c.rollout_id, [])
        best, best_seq, best_n = None, [], -1
        for e, seq in earlier:
            n = common_prefix(seq, c.prompt_ids)
            if n > best_n:
                best, best_seq, best_n = e, seq, n
        out.append(delta_against(c, best, best_seq))
        earlier.append((c, list(c.prompt_ids) + list(c.output_ids)))
    return out


MIN_SHARED_PREFIX = 16
"""a call's prompt is stored as a delta only when it shares at least this many tokens with its base"""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share (vectorized: prompts run to tens of thousands)."""
    import numpy as np

    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def materialize_prompts(calls: Sequence[CallRecord], path: str | os.PathLike = "<calls>") -> list[CallRecord]:
    """Return the calls with full `prompt_ids`, resolving delta encoding within each rollout.

    A reference must point to an earlier call (by seq) of the same rollout, and `prompt_base_len`
    must not exceed that call's prompt+output length; otherwise ArtifactError.
    """
    full: dict[tuple[str, str], list[int]] = {}  # (rollout, call) -> prompt + output
    out = []
    for c in sorted(calls, key=lambda c: (c.rollout_id, c.seq)):
        if c.prompt_base_call is None:
            prompt = list(c.prompt_ids)
        else:
            base = full.get((c.rollout_id, c.prompt_base_call))
            if base is None:
                raise ArtifactError(
                    path, "prompt_base_call",
                    f"call {c.call_id} of rollout {c.rollout_id} refers to {c.prompt_base_call!r}, not an earlier call of that rollout",
                )
            if c.prompt_base_len > len(base):
                raise ArtifactError(
                    path, "prompt_base_len",
                    f"call {c.call_id} shares {c.prompt_base_len} tokens with a call of only {len(base)}",
                )
            prompt = base[: c.prompt_base_len] + list(c.prompt_ids)
        full[(c.rollout_id, c.call_id)] = prompt + list(c.output_ids)
        out.append(dataclasses.replace(c, prompt_ids=prompt, prompt_base_call=None, prompt_base_len=0))
    return out
