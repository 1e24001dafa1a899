"""Atomic file writing: readers see the old file or the new one, never a mix, and a crash destroys neither.

A file is written to a temp file in the same folder, fsync'd, renamed over the target, and the folder
fsync'd. Temp files are made private (mkstemp) and then given the modes an ordinary open() would.
`no_space` tells a write that failed for want of disk space, so writers can say so in one line.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path


LOW_SPACE = 256 << 20
"""A write that fails with less than this free on its filesystem is taken for a full disk: some
writers report one with no errno (torch's zip writer: a RuntimeError, "unexpected pos")."""


def no_space(e: BaseException, where: str | os.PathLike | None = None) -> bool:
    """Whether `e`, raised by a write, means the disk is full: ENOSPC or EDQUOT, a message quoting the
    OS's "No space left" (pyarrow, safetensors), or, given the folder `where` written to, an OSError or
    RuntimeError while that filesystem has under LOW_SPACE free."""
    if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or "No space left" in str(e):
        return True
    if where is None or not isinstance(e, (OSError, RuntimeError)):
        return False
    try:
        return shutil.disk_usage(where).free < LOW_SPACE
    except OSError:  # the folder itself is gone: the original error says more
        return False


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a rename in it survives a crash (best effort: some filesystems refuse)."""
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
    fsync_dir(path.parent)
    return path
