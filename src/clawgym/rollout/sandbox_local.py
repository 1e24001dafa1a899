"""The `local` sandbox: a fresh host folder per rollout, isolated as far as this machine allows.

Layout of one sandbox (all removed on close):

    <base_dir>/<id>-XXXX/
      workspace/   seeded from the task; the commands' working directory
      home/ tmp/   HOME and TMPDIR of every command
      tests/       hidden tests, copied in by install_tests() after the harness finished
      logs/        stdout/stderr of every command
      files/       private files written by put_file (transcripts, harness configs)
      net/         Unix sockets of the proxy bridge and the black hole

Under bubblewrap the commands see none of these host paths: the workspace is bound at one fixed
path (`config.workdir`, default /workspace, as the docker sandbox mounts it) and home/ tmp/ tests/
files/ net/ at /sandbox/<name>, so every rollout of a task shows its harness the same working
directory, HOME and TMPDIR, and the policy never sees (or conditions on) a random host folder
(docs/harnesses.md, "One path in every sandbox"). Without a mount namespace (`unshare`,
`blackhole`, `host`) the commands use the host paths.

Every command runs through the launcher in sandbox_net.py (resource limits, then the relay) in a
new session, so its whole process group can be killed. Network modes:

- `bwrap`: bubblewrap with private network, pid and ipc namespaces; `/` read-only, `/tmp` and the
  sandboxes' parent folder hidden (sandboxes cannot see each other), only this sandbox writable.
- `unshare`: `unshare --net`: private network only (files are not hidden).
- `blackhole`: no namespace; HTTP(S)_PROXY points at a black hole that refuses and counts.
In the first two, the proxy is reached at 127.0.0.1:<its port> through the relay.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Mapping, Sequence

from clawgym.rollout import sandbox_net
from clawgym.rollout.sandbox_base import (MARKER, RunResult, SandboxConfig, SandboxError, kill_marked, limit_args, rmtree,
                                          seed_workspace)
from clawgym.rollout.sandbox_net import BlackHole, BlockedAttempt, UnixBridge

RELAY = Path(sandbox_net.__file__).resolve()
PACKAGE_ROOT = RELAY.parents[2]  # the folder holding the clawgym package (src/ of a checkout)
INSIDE = "/sandbox"
"""where a bwrap sandbox shows its private folders (home, tmp, tests, files, net), as the docker sandbox does"""
# Top-level host entries a bwrap sandbox does not show read-only: replaced by its own mounts.
_OWN_MOUNTS = ("proc", "dev", "tmp", INSIDE.strip("/"))
_probe_lock = threading.Lock()
_probes: dict[str, str | None] = {}


def namespace_problem(mode: str) -> str | None:
    """None if `mode` (bwrap | unshare) works here, else why not. Probed once per process."""
    with _probe_lock:
        if mode not in _probes:
            if mode == "bwrap":
                argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net", "--unshare-pid", "--die-with-parent", "true"]
            else:
                argv = ["unshare", "--net", "--fork", "true"]
            if shutil.which(argv[0]) is None:
                _probes[mode] = f"{argv[0]} is not installed"
            else:
                try:
                    r = subprocess.run(argv, capture_output=True, timeout=20)
                    _probes[mode] = None if r.returncode == 0 else f"{argv[0]} is not permitted here: {r.stderr.decode(errors='replace').strip()[:200]}"
                except (OSError, subprocess.TimeoutExpired) as e:
                    _probes[mode] = f"{argv[0]} failed: {e}"
        return _probes[mode]


def resolve_network(mode: str) -> str:
    if mode == "auto":
        for m in ("bwrap", "unshare"):
            if namespace_problem(m) is None:
                return m
        return "blackhole"
    if mode in ("bwrap", "unshare"):
        problem = namespace_problem(mode)
        if problem:
            raise SandboxError(f"sandbox network mode '{mode}': {problem}")
    return mode


def _host_root_args(skip: set[str]) -> list[str]:
    """bwrap arguments that show every top-level entry of the host's / read-only (links as links),
    except `skip`. Binding / itself read-only would leave no room for new mount points such as
    /workspace, so the sandbox's / is bwrap's own tmpfs with the host's entries bound into it."""
    argv: list[str] = []
    for name in sorted(os.listdir("/")):
        if name in skip:
            continue
        path = f"/{name}"
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    return argv


class LocalSandbox:
    kind = "local"

    def __init__(self, seed: Path | None, config: SandboxConfig, sandbox_id: str | None = None):
        self.config = config
        self.id = sandbox_id or uuid.uuid4().hex[:12]
        if not self.id.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise SandboxError(f"sandbox id {self.id!r} may only hold letters, digits, '-', '_' and '.'")
        self._closed = False
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen] = set()
        self._n = 0
        self._servers: list = []
        self.blackhole: BlackHole | None = None
        try:
            config.base_dir.mkdir(parents=True, exist_ok=True)
            self.root = Path(tempfile.mkdtemp(prefix=f"{self.id}-", dir=config.base_dir)).resolve()
            # The marker that close() finds stray processes by must be unique on this machine: two
            # runs may use the same sandbox id (the same rollout ids), and must not kill each other's.
            self.marker = self.root.name
        except OSError as e:
            raise SandboxError(f"cannot create a sandbox folder under {config.base_dir}: {e}") from None
        try:
            self._setup(seed)
        except BaseException:
            self.close()
            raise

    def _setup(self, seed: Path | None) -> None:
        self.workspace, self.home, self.tmp = self.root / "workspace", self.root / "home", self.root / "tmp"
        self.logs, self.net, self.tests = self.root / "logs", self.root / "net", self.root / "tests"
        self.files = self.root / "files"
        seed_workspace(seed, self.workspace)
        for d in (self.home, self.tmp, self.logs, self.net):
            d.mkdir()
        self.network = resolve_network(self.config.network)
        self._forwards: list[str] = []
        # host folder -> the path commands see it at; empty: they see host paths
        self._inside: list[tuple[Path, str]] = []
        if self.network == "bwrap":
            workdir = self.config.workdir
            top = Path(workdir).parts[1] if Path(workdir).is_absolute() and len(Path(workdir).parts) > 1 else None
            if top is None or top in _OWN_MOUNTS or (len(Path(workdir).parts) > 2 and os.path.lexists(f"/{top}")):
                raise SandboxError(f"sandbox workdir {workdir!r}: the local sandbox needs an absolute path in a new "
                                   f"top-level folder other than {', '.join('/' + t for t in _OWN_MOUNTS)} (e.g. /workspace)")
            self._inside = [(self.workspace, workdir)] + [(d, f"{INSIDE}/{d.name}") for d in (self.home, self.tmp, self.tests, self.files, self.net)]
            self._root_args = _host_root_args({*_OWN_MOUNTS, top})
        if self.network == "host":
            return
        self.blackhole = BlackHole()
        self._servers.append(self.blackhole)
        if self.network in ("bwrap", "unshare"):
            if len(str(self.net / "b.sock")) > 100:
                raise SandboxError(f"sandbox folder {self.root} is too deep for Unix sockets; use a shorter base_dir")
            self._bridge("b.sock", self.blackhole.port, tcp=("127.0.0.1", self.blackhole.port))
            p = self.config.proxy
            if p is not None:
                self._bridge("p.sock", p.port, tcp=None if p.unix_path else (p.host, p.port), unix=p.unix_path)

    def _bridge(self, name: str, inside_port: int, *, tcp=None, unix=None) -> None:
        path = str(self.net / name)
        self._servers.append(UnixBridge(path, tcp=tcp, unix=unix))
        self._forwards += ["--forward", f"127.0.0.1:{inside_port}={self.path_inside(Path(path))}"]

    # -----------------------------------------------------------------------------------------

    def base_env(self) -> dict[str, str]:
        tmp = self.path_inside(self.tmp)
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": self.path_inside(self.home), "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp,
            "LANG": "C.UTF-8", "TERM": "dumb", "USER": os.environ.get("USER", "clawgym"),
            MARKER: self.marker, "CLAWGYM_WORKSPACE": self.path_inside(self.workspace),
        }
        if self.blackhole is not None:
            for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
                env[k] = env[k.lower()] = self.blackhole.url
            env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost,::1"
        env.update(self.config.env)
        return env

    def _wrap(self, cmd: list[str], cwd: Path) -> list[str]:
        launcher = [sys.executable, "-I", "-S", str(RELAY), "relay", *limit_args(self.config.limits)]
        if self.network in ("bwrap", "unshare"):
            launcher += self._forwards
        launcher += ["--", *cmd]
        if self.network == "unshare":
            return ["unshare", "--net", "--fork", "--kill-child", "--", *launcher]
        if self.network != "bwrap":
            return launcher
        argv = ["bwrap", "--die-with-parent", "--unshare-net", "--unshare-pid", "--unshare-ipc",
                *self._root_args, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        base = self.config.base_dir.resolve()
        if not base.is_relative_to("/tmp"):
            argv += ["--tmpfs", str(base)]
        for hidden in self.config.hide:
            if Path(hidden).is_dir():
                argv += ["--tmpfs", str(Path(hidden).resolve())]
        # The relay and the built-in harness (`python -c ENTRY`, agentloop.py) import this package: when it
        # lives under a hidden folder (an editable install from a checkout in /tmp, as CI makes),
        # show its folder read-only at the same path, so the .pth entry still resolves inside.
        # The same for a Python environment (a venv) that lives there.
        for needed in dict.fromkeys([PACKAGE_ROOT, Path(sys.prefix).resolve()]):
            if needed.is_relative_to("/tmp") or needed.is_relative_to(base):
                argv += ["--ro-bind", str(needed), str(needed)]
        for host, inside in self._inside:
            if host.is_dir():  # tests/ and files/ appear only once the runner writes them
                argv += ["--bind", str(host), inside]
        # the tmpfs / read-only, as the host's is: writes go to the workspace, HOME or a temp dir
        return argv + ["--remount-ro", "/", "--chdir", self.path_inside(cwd), "--", *launcher]

    def run(self, cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: str | None = None,
            name: str = "run", stdin: bytes | None = None) -> RunResult:
        cmd = [str(c) for c in cmd]
        if not cmd:
            raise SandboxError("run: empty command")
        full_env = {**self.base_env(), **(env or {})}
        full_env[MARKER] = self.marker  # the caller cannot drop the marker that close() relies on
        work = (self.workspace / cwd).resolve() if cwd else self.workspace
        if not work.is_relative_to(self.root):
            raise SandboxError(f"run: cwd {cwd!r} is outside the sandbox")
        if os.sep not in cmd[0] and shutil.which(cmd[0], path=full_env["PATH"]) is None:
            raise SandboxError(f"cannot start {cmd[0]!r}: not found on PATH")
        with self._lock:
            if self._closed:
                raise SandboxError(f"sandbox {self.id} is closed")
            self._n += 1
            out, err = self.logs / f"{name}-{self._n}.stdout", self.logs / f"{name}-{self._n}.stderr"
        t0 = time.monotonic()
        with open(out, "wb") as fo, open(err, "wb") as fe:
            try:
                p = subprocess.Popen(self._wrap(cmd, work), cwd=work, env=full_env, stdout=fo, stderr=fe,
                                     stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                raise SandboxError(f"cannot start {cmd[0]!r}: {e}") from None
            with self._lock:
                self._procs.add(p)
            timed_out = False
            try:
                if stdin is not None:
                    try:
                        p.stdin.write(stdin)
                        p.stdin.close()
                    except BrokenPipeError:
                        pass
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._terminate(p)
            finally:
                # Nothing a finished command started may outlive it (daemons, stray children).
                self._killpg(p.pid, signal.SIGKILL)
                if p.poll() is None:
                    p.kill()
                p.wait()
                with self._lock:
                    self._procs.discard(p)
        if timed_out:
            self._kill_marked()
        cancelled = self._closed and not timed_out and p.returncode < 0
        code = None if timed_out or cancelled else p.returncode
        return RunResult(code, timed_out, out, err, time.monotonic() - t0, cancelled)

    def _killpg(self, pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _terminate(self, p: subprocess.Popen) -> None:
        self._killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=self.config.kill_grace_s)
        except subprocess.TimeoutExpired:
            pass
        self._killpg(p.pid, signal.SIGKILL)

    def _kill_marked(self, wait_s: float = 3.0) -> int:
        return kill_marked(self.marker, wait_s)

    def put_file(self, rel: str, data: bytes) -> str:
        path = (self.files / rel).resolve()
        if not path.is_relative_to(self.files) or rel.startswith("/"):
            raise SandboxError(f"put_file: {rel!r} leaves the sandbox's private folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return self.path_inside(path)

    def install_tests(self, tests_dir: Path) -> str:
        if self.tests.exists():
            rmtree(self.tests)  # whatever the harness put there is not the task's tests
        if tests_dir is not None and Path(tests_dir).is_dir():
            shutil.copytree(tests_dir, self.tests, symlinks=False)
        else:
            self.tests.mkdir()
        return self.path_inside(self.tests)

    def path_inside(self, host_path: Path) -> str:
        path = Path(host_path).resolve()
        for host, inside in self._inside:
            if path.is_relative_to(host):
                return str(Path(inside) / path.relative_to(host))
        if self._inside and path.is_relative_to(self.root):
            raise SandboxError(f"{path} is not visible inside sandbox {self.id}")
        return str(path)

    def blocked_attempts(self) -> list[BlockedAttempt]:
        return list(self.blackhole.attempts) if self.blackhole is not None else []

    def close(self) -> None:
        with self._lock:
            self._closed = True
            procs = list(self._procs)
        for p in procs:
            self._killpg(p.pid, signal.SIGKILL)
        self._kill_marked()
        for s in self._servers:
            s.close()
        self._servers = []
        if not self.config.keep and getattr(self, "root", None) is not None and self.root.exists():
            rmtree(self.root)

    def __enter__(self) -> "LocalSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
