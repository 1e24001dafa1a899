"""JSONL logs (call records, metrics, train metrics, transcripts): fsync'd appends, reads that survive a torn line.

`JsonlWriter` appends one record per line and fsyncs each; `read_jsonl` yields every complete line of
a file whose last line was torn by a crash, and reports the torn one. `rows_from_dicts` validates
records into typed rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson

from clawgym.artifacts.rows import REQUIRED_FIELDS, ArtifactError, Row, Transcript


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
        missing = REQUIRED_FIELDS[row_type.KIND] - rec.keys()
        if missing:
            raise ArtifactError(path, sorted(missing)[0], f"missing in record {i}")
        out.append(row_type(**{k: v for k, v in rec.items() if k in names}))
    return out


def read_transcripts(path: str | os.PathLike) -> dict[str, Transcript]:
    """transcripts.jsonl -> {rollout id: transcript}; a rerun rollout's last line wins (as in results.jsonl)."""
    return {t.rollout_id: t for t in (Transcript.from_json(r, path) for r in read_jsonl(path).records)}
