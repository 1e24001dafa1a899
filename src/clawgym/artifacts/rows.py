"""What each artifact file holds: the typed rows, their Parquet schemas, and the error for a file that does not.

`CallRecord`, `RolloutRecord`, `TreeNode`: one dataclass per table row (docs/architecture.md), each
with an explicit pyarrow schema; `Transcript` is one line of transcripts.jsonl. The enumerated string
fields list their allowed values here, and `ENUM_FIELDS` / `REQUIRED_FIELDS` tell the readers
(`tables`, `jsonl`) what to check.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

SCHEMA_VERSION = 1

# Allowed values of the enumerated string fields; readers check them.
PROTOCOLS = ("anthropic", "openai-chat", "openai-responses", "direct")
CALL_STATUSES = ("ok", "engine_error", "client_error", "cancelled")
CALL_ROLES = ("main", "subagent", "compaction", "aux")
ROLLOUT_STATUSES = ("ok", "timeout", "harness_error", "infra_error", "check_error")
EXCLUDED_STATUSES = ("infra_error", "check_error")
"""rollout statuses that are nobody's outcome of the policy: no reward, out of GRPO groups, training and Pass@1"""
NODE_KINDS = ("model", "env")


class ArtifactError(Exception):
    """A file that does not hold what its kind promises. The message names file and field."""

    def __init__(self, path: str | os.PathLike, field: str | None, problem: str):
        problem = " ".join(str(problem).split())  # one line, whatever a library's message held (pyarrow's end in newlines)
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
    """ok | timeout | harness_error | infra_error | check_error (the task's check crashed)"""
    reward: float | None
    """null when excluded (infra_error, check_error)"""
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
        return self.status not in EXCLUDED_STATUSES and self.reward is not None


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
ENUM_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("calls", "protocol"): PROTOCOLS,
    ("calls", "status"): CALL_STATUSES,
    ("calls", "role"): CALL_ROLES,
    ("rollouts", "status"): ROLLOUT_STATUSES,
    ("trees", "kind"): NODE_KINDS,
    ("trees", "role"): CALL_ROLES,
}

# Fields a Parquet file may lack and still be read (filled with the dataclass default), so that
# optional columns added later do not break reading older files of the same schema version.
REQUIRED_FIELDS: dict[str, set[str]] = {
    kind: {f.name for f in dataclasses.fields(t) if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    for kind, t in ROW_TYPES.items()
}


def field_default(row_type: type, name: str) -> Any:
    """The dataclass default of a row field (what a reader fills in for a missing optional column)."""
    f = next(f for f in dataclasses.fields(row_type) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
