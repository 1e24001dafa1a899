"""The one console every stage prints through.

Everything human-readable goes to stderr through `STDERR` (a rich Console that looks up sys.stderr
at print time, so captured and redirected streams work); stdout is left to a command's result
(its summary line, or its `--json` object). A stage takes a console argument: the stage commands
pass `STDERR` and print their tables; `clawgym run` passes `QUIET` unless --verbose, and prints one
line per step under one progress bar over the steps (`run/progress.py`).
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

OFF_TTY_WIDTH = 200
"""the width tables are laid out for when the stream is a file or pipe (rich would assume 80)"""


class TableConsole(Console):
    """A Console whose tables never cut a cell short: a column that does not fit folds its text
    onto the next line instead of ending it in "…" (rich's default), so every number prints whole."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for obj in objects:
            if isinstance(obj, Table):
                for column in obj.columns:
                    if column.overflow == "ellipsis":
                        column.overflow = "fold"
        super().print(*objects, **kwargs)


def console(stderr: bool = False) -> Console:
    """A TableConsole on stdout or stderr: the terminal's width on a terminal, OFF_TTY_WIDTH columns
    (or $COLUMNS) off one, so a table in a log file or pipe keeps its layout."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else OFF_TTY_WIDTH
    return TableConsole(stderr=stderr, soft_wrap=True, width=width)  # a long line stays one line in a log


class TableRecorder(TableConsole):
    """A console that prints nothing and keeps what would have been printed as plain data: each table
    as {title, rows: [{column: value}]} (numbers as numbers), each line of text as a string. It gives
    a command that prints tables its `--json` (`clawgym inspect --json`)."""

    def __init__(self) -> None:
        super().__init__(file=io.StringIO(), width=OFF_TTY_WIDTH)
        self.tables: list[dict[str, Any]] = []
        self.lines: list[str] = []

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for obj in objects:
            if isinstance(obj, Table):
                self.tables.append(table_data(obj))
            elif isinstance(obj, (str, Text)):
                self.lines.append(_plain(obj))


def _plain(value: Any) -> str:
    if isinstance(value, Text):
        return value.plain
    return Text.from_markup(value).plain if isinstance(value, str) else str(value)


def _value(cell: Any) -> Any:
    """A table cell as JSON: an int or float when the text is one (thousands separators dropped), else the text."""
    text = _plain(cell).strip()
    bare = text.replace(",", "")
    for kind in (int, float):
        try:
            return kind(bare)
        except ValueError:
            pass
    return text


def table_data(table: Table) -> dict[str, Any]:
    """A rich Table's title and rows as plain data."""
    names = [_plain(c.header) for c in table.columns]
    columns = [list(c.cells) for c in table.columns]
    rows = [dict(zip(names, map(_value, row))) for row in zip(*columns)]
    return {"title": _plain(table.title) if table.title else None, "rows": rows}


STDERR = console(stderr=True)
# soft_wrap: a printed line stays one line when stderr is a file or pipe (rich would break it at 80
# columns there); tables still fit the width.
QUIET = Console(file=io.StringIO(), quiet=True)
"""a console that prints nothing: the stages' tables under `clawgym run` without --verbose (not a
terminal, so a stage's progress bar on it does not capture what other code prints to stderr)"""
