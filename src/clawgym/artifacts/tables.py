"""Parquet tables of typed rows: atomic writes, and reads that validate kind, version, columns and values.

Parquet files carry `schema_version` and `kind` in their metadata. `write_table` writes atomically
(temp file in the same folder, fsync, rename), so a reader never sees half a file and a crash never
destroys the previous version. `read_table` / `read_arrow` raise one `ArtifactError` naming the file
and the field.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from clawgym.artifacts.files import fsync_dir, no_space, umask_modes
from clawgym.artifacts.rows import ENUM_FIELDS, REQUIRED_FIELDS, SCHEMA_VERSION, ArtifactError, Row, field_default


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
        if no_space(e):  # pyarrow's IO errors carry no errno, only the OS message
            raise ArtifactError(path, None, "could not be written: no space left on device; "
                                            "any previous file is unchanged") from e
        raise
    fsync_dir(path.parent)
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
    try:
        table = pf.read()
    except (OSError, pa.ArrowException) as e:  # a footer that parses over damaged pages (ZSTD, CRC, truncation)
        raise ArtifactError(path, None, f"damaged: its data cannot be read ({e}); recreate it (rerun the stage "
                                        f"that wrote it with --force)") from None
    present = set(table.column_names)
    for name in row_type.SCHEMA.names:
        if name not in present:
            if name in REQUIRED_FIELDS[row_type.KIND]:
                raise ArtifactError(path, name, "missing column")
            default = field_default(row_type, name)
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
    for (k, name), allowed in ENUM_FIELDS.items():
        if k == row_type.KIND:
            values = set(table.column(name).unique().to_pylist())
            bad_values = values - set(allowed)
            if bad_values:
                raise ArtifactError(path, name, f"unknown value(s) {sorted(map(str, bad_values))}; allowed: {', '.join(allowed)}")
    for name in REQUIRED_FIELDS[row_type.KIND]:
        if row_type.SCHEMA.field(name).type in (pa.string(), pa.int64()) and name != "reward":
            if table.column(name).null_count:
                raise ArtifactError(path, name, "has null values")
    return table


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

