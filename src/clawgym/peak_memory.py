"""The process's peak resident memory over a stretch of work, for the per-phase `memory/` metrics.

Linux keeps a process's high-water resident set size (`VmHWM` in /proc/self/status) and resets it
to the present size when "5" is written to /proc/self/clear_refs, so a phase's own peak is read by
resetting before the phase and reading after it. The engine, the trainer and the proxy share one
process in `clawgym run`, so the figure is what they held together at the phase's worst moment
(harness subprocesses are not in it). Where the reset is not allowed (another OS, a locked-down
/proc), the figure is the process's peak since it started (`ru_maxrss`), which still names the phase
in which the run's peak was reached: the first phase whose figure equals the run's largest.

`room` is how far this process's resident memory may still grow: the machine's MemAvailable, or
less where a cgroup (a container, a systemd slice) caps the memory below what the machine has left.
The trainer's memory check and the engine's prefix-cache budget both start from it.

`release` hands the heap memory freed by a phase back to the OS. glibc's malloc keeps freed blocks
below its mmap threshold in the process, and a training phase frees many such blocks (activations,
the model and optimizer it loaded): without a trim the next phase starts with them still resident,
and the engine's allocations land between them, so the resident size grows from step to step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
import sys
from pathlib import Path

GIB = 2.0 ** 30


def reset() -> bool:
    """Start a new high-water mark at the present resident size; False where the OS does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status in bytes (`VmHWM`: the high-water mark, `VmRSS`: now); None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_gib() -> float:
    """The resident high-water mark in GiB: since the last `reset`, or since the process started."""
    hwm = status_bytes("VmHWM")
    if hwm is not None:
        return hwm / GIB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / GIB if sys.platform == "darwin" else rss * 1024 / GIB  # bytes on macOS, KiB elsewhere


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _cgroup_room() -> int | None:
    """The cgroup's limit less what the cgroup already uses (v2, then v1); None without a limit."""
    v2 = Path("/sys/fs/cgroup")
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        own = []
    rel = next((line.split(":", 2)[2] for line in own if line.startswith("0::")), "/")
    for d in (v2 / rel.lstrip("/"), v2):
        limit, used = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        if limit is not None and used is not None:
            return max(limit - used, 0)
    v1 = v2 / "memory"
    limit, used = _read_int(v1 / "memory.limit_in_bytes"), _read_int(v1 / "memory.usage_in_bytes")
    if limit is not None and used is not None and limit < 1 << 60:  # v1 writes a huge number for no limit
        return max(limit - used, 0)
    return None


def room() -> tuple[int, str] | None:
    """How many more bytes this process may take before the kernel has none to give, and whose figure
    that is ("MemAvailable" or "the cgroup's limit"); None where neither can be read (not Linux)."""
    options = [(b, why) for b, why in ((_meminfo_available(), "MemAvailable"), (_cgroup_room(), "the cgroup's limit"))
               if b is not None]
    return min(options) if options else None


@functools.cache
def _libc_trim():
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release() -> bool:
    """Return the heap's free memory to the OS (glibc `malloc_trim(0)`, every arena); False where the C
    library has no such call (musl, macOS), which leaves the memory as it is."""
    trim = _libc_trim()
    if trim is None:
        return False
    trim(0)
    return True
