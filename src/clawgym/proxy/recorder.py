"""Call records: one append-only JSONL file per rollout, and their export to calls.parquet.

Each finished call (ok or failed) becomes one `CallRecord` line in `RECORDS/<rollout_id>.jsonl`,
fsync'd before the call stops counting as in flight — so a runner that settles on "nothing in
flight and the record count unchanged" never collects a half-written rollout (paper §3.4).
Prompts are delta-encoded against an earlier call of the same rollout (`prompt_base_call`,
`prompt_base_len`: that call's prompt+output shares that many leading tokens) by the codec in
artifacts/codec.py, which the renderer feeds; `export_calls` writes calls.parquet with full prompts or kept deltas.

fsync runs in a small thread pool so the event loop keeps serving; a per-rollout lock keeps each
file's lines in completion order. Nothing secret is ever written: records hold tokens and
request metadata, never headers or keys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from clawgym.artifacts import CallRecord, JsonlWriter, materialize_prompts, read_jsonl, rows_from_dicts, write_table
from clawgym.errors import UserError

ROLLOUT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FIELDS = [f.name for f in dataclasses.fields(CallRecord)]
MAX_OPEN_FILES = 256


def check_rollout_id(rollout_id: str) -> str:
    """Rollout ids become file names: letters, digits, '.', '_', '-', at most 128, no leading dot."""
    if not isinstance(rollout_id, str) or not ROLLOUT_ID.match(rollout_id):  # JSON may send any type
        raise UserError(f"invalid rollout id {rollout_id!r}: use letters, digits, '.', '_' or '-' (1-128 chars)")
    return rollout_id


class Recorder:
    """Appends CallRecords to per-rollout JSONL files; see the module docstring."""

    def __init__(self, records_dir: str | Path):
        self.dir = Path(records_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._writers: dict[str, JsonlWriter] = {}
        self._mutex = threading.Lock()
        self._locks: dict[str, asyncio.Lock] = {}
        self._counts: dict[str, int] = {}
        self._bytes = 0
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="clawgym-records")

    def path(self, rollout_id: str) -> Path:
        return self.dir / f"{rollout_id}.jsonl"

    def count(self, rollout_id: str) -> int:
        return self._counts.get(rollout_id, 0)

    @property
    def bytes_written(self) -> int:
        return self._bytes

    def _writer(self, rollout_id: str) -> JsonlWriter:
        with self._mutex:  # the pool's threads share the table; only 2 writers are ever in use at once
            w = self._writers.pop(rollout_id, None)
            if w is None:
                w = JsonlWriter(self.path(rollout_id))  # appends: reopening a closed rollout's file is safe
                while len(self._writers) >= MAX_OPEN_FILES:  # bound file descriptors: close the idlest
                    self._writers.pop(next(iter(self._writers))).close()
            self._writers[rollout_id] = w  # most recently used last
            return w

    def _append(self, rollout_id: str, rec: dict) -> int:
        return self._writer(rollout_id).append(rec)

    async def record(self, rec: CallRecord) -> None:
        """Append one record (fsync'd) off the event loop, in order per rollout."""
        row = {name: getattr(rec, name) for name in _FIELDS}  # no deep copy of the id lists
        lock = self._locks.setdefault(rec.rollout_id, asyncio.Lock())
        async with lock:
            # counted here, on the event loop: the pool's threads would race on the sum
            self._bytes += await asyncio.get_running_loop().run_in_executor(self._pool, self._append, rec.rollout_id, row)
            self._counts[rec.rollout_id] = self._counts.get(rec.rollout_id, 0) + 1

    def close_rollout(self, rollout_id: str) -> None:
        with self._mutex:
            w = self._writers.pop(rollout_id, None)
        if w is not None:
            w.close()
        self._locks.pop(rollout_id, None)

    def close(self) -> None:
        for rid in list(self._writers):
            self.close_rollout(rid)
        self._pool.shutdown(wait=True)


def read_records(path: str | Path) -> list[CallRecord]:
    """One rollout's records (a torn last line from a crash is skipped), in arrival order."""
    read = read_jsonl(path)
    rows = rows_from_dicts(read.records, CallRecord, path)
    return sorted(rows, key=lambda r: r.seq)


def export_calls(records_dir: str | Path, out: str | Path, *, full_prompts: bool = True) -> int:
    """Write every record under `records_dir` to `out` (calls.parquet); returns the row count.

    With `full_prompts` (the default) delta-encoded prompts are expanded, so each row stands alone;
    otherwise the deltas are kept as recorded (smaller; `materialize_prompts` expands them later).
    """
    records_dir = Path(records_dir)
    if not records_dir.is_dir():
        raise UserError(f"records directory {records_dir} does not exist")
    rows: list[CallRecord] = []
    for path in sorted(records_dir.glob("*.jsonl")):
        recs = read_records(path)
        rows += materialize_prompts(recs, path) if full_prompts else recs
    write_table(out, rows, CallRecord)
    return len(rows)
