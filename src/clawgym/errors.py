"""The one exception type for mistakes a user can fix (bad input, wrong paths, bad configs).

The CLI prints such an error as one line and exits 1; anything else is a bug and shows a traceback.
`did_you_mean` adds the closest known name to an "unknown key" message; `check_out_dir` and
`check_writable_file` refuse an output path that cannot be written before anything is.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Iterable


class UserError(Exception):
    """A problem with the user's input; the message says what was wrong and where."""


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """" (did you mean 'lr'?)" for the closest of `known` to a mistyped `word`, or "" when none is close."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_out_dir(path: Path, flag: str) -> None:
    """Refuse, before anything is written, an output directory that cannot be one: an existing file, or
    a path under a file (a missing parent is fine: it is made)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a directory: name a directory (it is made if missing)")
    base = _first_existing(path)
    if not base.is_dir():
        raise UserError(f"{flag} {path}: {base} is a file, so no directory can be made under it")


def check_writable_file(path: Path, flag: str, *, make_folder: bool = False) -> None:
    """Refuse an output file that names a directory, or whose folder does not exist (with `make_folder`,
    the writer makes it: then only a folder that cannot be made, under a file, is refused)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory: name a file in it")
    if make_folder:
        check_out_dir(path.parent, f"{flag} {path}: its folder")
        return
    if not path.parent.is_dir():
        why = "is a file" if path.parent.exists() else "does not exist"
        raise UserError(f"{flag} {path}: its folder {path.parent} {why}")
