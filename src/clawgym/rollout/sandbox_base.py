"""What every sandbox backend shares: the config, limits, run result and Protocol, and small helpers.

sandbox.py re-exports these and opens a backend by name; the backends (sandbox_local.py,
sandbox_docker.py) import from here, so no backend imports the module that chooses among them.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence, runtime_checkable

from clawgym.rollout.sandbox_net import BlockedAttempt

NETWORK_MODES = ("auto", "bwrap", "unshare", "blackhole", "host")
"""auto: bwrap, else unshare, else blackhole. host: no restriction (debugging only)."""


class SandboxError(Exception):
    """The sandbox could not be created or used (an infrastructure failure, not the harness's)."""


@dataclass(frozen=True)
class Limits:
    """Per-process resource limits (setrlimit in the child). None = inherit the host's limit.

    Memory is an address-space limit, which Node-based harnesses exceed at start-up (V8 reserves
    large virtual ranges), so it is off by default; set it for Python-only harnesses.
    """

    memory_mb: int | None = None
    cpu_seconds: int | None = None
    file_size_mb: int | None = 4096
    open_files: int | None = 4096
    processes: int | None = None
    """RLIMIT_NPROC; counted per user and not enforced for root"""


@dataclass(frozen=True)
class ProxyEndpoint:
    """Where the serving proxy listens on the host. Inside the sandbox it is always reached at
    http://127.0.0.1:<port>, so base URLs handed to the harness stay the same in every mode."""

    port: int
    host: str = "127.0.0.1"
    unix_path: str | None = None
    """the proxy's own Unix socket, if it has one (then host is not used)"""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def seed_workspace(seed: Path | None, workspace: Path) -> None:
    """A rollout's fresh workspace: a copy of the task's seed folder (links kept as links), or empty."""
    if seed is not None and Path(seed).is_dir():
        shutil.copytree(seed, workspace, symlinks=True)
    else:
        workspace.mkdir()


def default_base_dir() -> Path:
    return Path(tempfile.gettempdir()) / "clawgym-sandboxes"


@dataclass
class SandboxConfig:
    base_dir: Path = field(default_factory=default_base_dir)
    """parent of every sandbox folder; bubblewrap hides it, so sandboxes cannot see each other"""
    network: str = "auto"
    proxy: ProxyEndpoint | None = None
    limits: Limits = field(default_factory=Limits)
    hide: list[Path] = field(default_factory=list)
    """host folders masked (empty) inside a bwrap sandbox, e.g. the task set, whose hidden tests
    the harness could otherwise read through the read-only view of /"""
    env: dict[str, str] = field(default_factory=dict)
    """extra environment for every command (the harness adds its own per run)"""
    kill_grace_s: float = 2.0
    """SIGTERM, then this long, then SIGKILL"""
    keep: bool = False
    """keep the folder after close (debugging)"""
    image: str = "clawgym-base:bookworm"
    """docker backend: the image to run (any glibc image with `sh` and `sleep`; scripts/docker-engine.sh makes this one)"""
    workdir: str = "/workspace"
    """docker backend: where the workspace is mounted (Harbor tasks: the task's workdir, e.g. /app)"""
    cpus: float | None = None
    """docker backend: CPU quota of the container"""

    def __post_init__(self) -> None:
        if self.network not in NETWORK_MODES:
            raise ValueError(f"sandbox network mode {self.network!r}; allowed: {', '.join(NETWORK_MODES)}")
        self.base_dir = Path(self.base_dir)


@dataclass(frozen=True)
class RunResult:
    """What one command did. Its output is in files, so a chatty harness costs no memory."""

    exit_code: int | None
    """None when it was killed on timeout or by close()"""
    timed_out: bool
    stdout_path: Path
    stderr_path: Path
    wall_time_s: float
    cancelled: bool = False
    """killed because the sandbox was closed while it ran"""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def stdout(self, limit: int = 1 << 20) -> str:
        return _tail(self.stdout_path, limit)

    def stderr(self, limit: int = 1 << 20) -> str:
        return _tail(self.stderr_path, limit)


def _tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


@runtime_checkable
class Sandbox(Protocol):
    """One rollout's isolated place. Use as a context manager, or call close()."""

    id: str
    kind: str
    """backend name: local | docker"""
    network: str
    """the network mode in effect (auto resolved): bwrap | unshare | blackhole | host | none"""
    workspace: Path
    """host path of the workspace (the commands' working directory)"""
    home: Path
    """host path of the commands' HOME (harness config files go here)"""
    logs: Path
    """host folder with every command's stdout/stderr"""

    def run(
        self,
        cmd: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        name: str = "run",
        stdin: bytes | None = None,
    ) -> RunResult:
        """Run `cmd` (in the workspace unless `cwd`, a path relative to it); block until it exits or
        `timeout` seconds pass. Whatever it started is killed when it returns."""
        ...

    def put_file(self, rel: str, data: bytes) -> str:
        """Write a private file (a transcript, a harness config) outside the workspace; returns its
        path inside the sandbox. `rel` is relative and may not leave the private folder."""
        ...

    def install_tests(self, tests_dir: Path) -> str:
        """Copy hidden tests in (after the harness finished); returns their path inside the sandbox."""
        ...

    def path_inside(self, host_path: Path) -> str:
        """The path a command in the sandbox uses for a file under the sandbox's folder."""
        ...

    def blocked_attempts(self) -> list[BlockedAttempt]:
        """Outside connections refused so far."""
        ...

    def close(self) -> None:
        """Kill everything started here and remove the files (idempotent)."""
        ...

    def __enter__(self) -> "Sandbox": ...

    def __exit__(self, *exc: object) -> None: ...


def limit_args(limits: Limits) -> list[str]:
    """The relay's --limit arguments for these resource limits (sandbox_net.py sets them as rlimits)."""
    out = ["--limit", "core=0"]
    mb = 1024 * 1024
    for name, value, scale in (
        ("as", limits.memory_mb, mb), ("cpu", limits.cpu_seconds, 1), ("fsize", limits.file_size_mb, mb),
        ("nofile", limits.open_files, 1), ("nproc", limits.processes, 1),
    ):
        if value is not None:
            out += ["--limit", f"{name}={int(value) * scale}"]
    return out


def rmtree(path: Path) -> None:
    """Remove a sandbox's folder, read-only parts included."""
    def onerror(func, p, _exc):  # a harness may leave read-only files and folders behind
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


MARKER = "CLAWGYM_SANDBOX_ID"
"""the environment variable every command of a sandbox carries; its value is unique on this machine"""


def marked_pids(marker: str) -> list[int]:
    """Live host processes whose environment carries MARKER=marker (a container's too: they are host
    processes in their own pid namespace)."""
    needle = f"{MARKER}={marker}\0".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    with open(f"/proc/{entry}/stat", "rb") as st:
                        if st.read().rsplit(b")", 1)[-1].split()[0] != b"Z":
                            out.append(int(entry))
        except OSError:
            continue
    return out


def kill_marked(marker: str, wait_s: float = 3.0, sig: int = signal.SIGKILL) -> int:
    """Send `sig` to every live process carrying the marker (also those that left their process
    group by setsid) until none is left or `wait_s` passed; the kernel tears a pid namespace down
    asynchronously, so this waits for them to be gone."""
    killed = 0
    deadline = time.monotonic() + wait_s
    while True:
        pids = marked_pids(marker)
        if not pids or time.monotonic() > deadline:
            return killed
        for pid in pids:
            try:
                os.kill(pid, sig)
                killed += 1
            except OSError:
                pass
        time.sleep(0.02)
