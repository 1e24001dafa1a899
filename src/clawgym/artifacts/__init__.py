"""The stages' only shared vocabulary: typed rows, their schemas, safe readers/writers, and the prompt codec.

Every stage of clawgym (proxy, rollout, trees, train, eval) exchanges files on disk. This package
defines what those files hold (docs/architecture.md) and how they are written and read, one job per
module; stages import the names from here:

- `rows`: `CallRecord`, `RolloutRecord`, `TreeNode`, `Transcript`, their Parquet schemas, the
  allowed values of enumerated fields, and `ArtifactError` (names the file and the field);
- `files`: atomic writes (temp file, fsync, rename) with the modes an ordinary open() gives;
- `tables`: Parquet tables of typed rows, written atomically, read with validation;
- `jsonl`: fsync'd append-only logs whose readers survive a line torn by a crash;
- `redact`: stage configs recorded next to their output, credentials redacted;
- `metrics_jsonl`: the lines of metrics.jsonl;
- `codec`: the prompt delta codec, the one rule by which the proxy stores a prompt against an
  earlier call of its rollout and by which every reader gets the full prompt back.
"""

from clawgym.artifacts.codec import (
    MIN_SHARED_PREFIX,
    PromptBase,
    PromptDelta,
    check_base_len,
    common_prefix,
    delta_encode_calls,
    encode_prompt,
    extended_call,
    link_bases,
    materialize_prompts,
)
from clawgym.artifacts.files import atomic_write_bytes, fsync_dir, no_space, process_umask, umask_modes
from clawgym.artifacts.jsonl import JsonlRead, JsonlWriter, TornLine, read_jsonl, read_transcripts, rows_from_dicts
from clawgym.artifacts.metrics_jsonl import METRIC_PREFIXES, MetricsLine, append_metrics, read_metrics
from clawgym.artifacts.redact import SECRET_KEYS, redact, write_config
from clawgym.artifacts.rows import (
    CALL_ROLES,
    CALL_STATUSES,
    EXCLUDED_STATUSES,
    NODE_KINDS,
    PROTOCOLS,
    ROLLOUT_STATUSES,
    ROW_TYPES,
    SCHEMA_VERSION,
    ArtifactError,
    CallRecord,
    RolloutRecord,
    Row,
    Transcript,
    TranscriptMessage,
    TranscriptToolCall,
    TreeNode,
)
from clawgym.artifacts.tables import file_kind, read_arrow, read_table, read_table_rows, to_arrow, write_table

__all__ = [
    "CALL_ROLES", "CALL_STATUSES", "EXCLUDED_STATUSES", "METRIC_PREFIXES", "MIN_SHARED_PREFIX", "NODE_KINDS", "PROTOCOLS",
    "ROLLOUT_STATUSES", "ROW_TYPES", "SCHEMA_VERSION", "SECRET_KEYS", "ArtifactError", "CallRecord", "JsonlRead",
    "JsonlWriter", "MetricsLine", "PromptBase", "PromptDelta", "RolloutRecord", "Row", "TornLine", "Transcript",
    "TranscriptMessage", "TranscriptToolCall", "TreeNode", "append_metrics", "atomic_write_bytes", "check_base_len",
    "common_prefix", "delta_encode_calls", "encode_prompt", "extended_call", "file_kind", "fsync_dir", "no_space",
    "link_bases", "materialize_prompts", "process_umask", "read_arrow", "read_jsonl", "read_metrics", "read_table",
    "read_table_rows", "read_transcripts", "redact", "rows_from_dicts", "to_arrow", "umask_modes", "write_config",
    "write_table",
]
