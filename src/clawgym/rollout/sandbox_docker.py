"""The `docker` sandbox: one container per rollout (docker SDK), isolated from the host and from
other rollouts' containers.

The workspace, hidden tests and Harbor logs are host folders bind-mounted at `config.workdir`
(default /workspace), /tests and /logs, so the verifier and the runner read results on the host;
the private folders (home, files, logs, net) appear at /sandbox/<name>. The runner's own Python
(its prefix, or a system Python's parts), the clawgym package and the npm-installed harnesses are
mounted read-only at their host paths, the host's `node` at /sandbox/bin/node and `python3` there
runs the runner's Python, so the built-in harness, the relay, the verifier and Claude Code run in
any glibc image with the C libraries Python's modules load, without being installed in it
(docs/harnesses.md, "Sandboxes"). Commands run as the runner's user (files in the workspace stay the runner's).

The container has no network (`network_mode="none"`); as in the local bwrap mode, every command
runs under the relay (copied in as /sandbox/net/relay.py) that listens on 127.0.0.1:<proxy port>
inside and forwards to a Unix socket bridged to the proxy on the host, and HTTP(S)_PROXY points at
the black hole. A command runs detached with its output redirected into the logs folder; the host
polls it, and on timeout kills every process carrying the sandbox's marker (the whole tree,
daemons included). An engine that stops answering is a SandboxError (the rollout's infra_error).

Containers are labelled with the runner's host, pid and process start time; `prepare_engine()`,
called once when a run starts, removes the containers (and folders) of runners that no longer
live, so a SIGKILLed runner leaves nothing behind past the next run's start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Mapping, Sequence

from clawgym.home import clawgym_home
from clawgym.rollout.sandbox_base import (MARKER, RunResult, SandboxConfig, SandboxError, kill_marked, limit_args, rmtree,
                                          seed_workspace)
from clawgym.rollout.sandbox_net import BlackHole, BlockedAttempt, UnixBridge

INSIDE = "/sandbox"
RELAY = Path(__file__).resolve().with_name("sandbox_net.py")
PACKAGE_ROOT = RELAY.parents[2]  # the folder holding the clawgym package (src/ of a checkout)
LABEL_RUNNER = "clawgym.runner"
"""host:pid:start-time of the process that owns the container"""
LABEL_ROOT = "clawgym.root"
"""the container's host folder, removed with a leftover container"""
_SYSTEM_PREFIXES = ("/", "/usr", "/usr/local")
"""a Python installed here is the image's business: mounting the host's would hide the image's own files"""


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[19].decode()
    except (OSError, IndexError):
        return None


def runner_label(pid: int | None = None) -> str:
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def _alive(label: str) -> bool:
    """Whether the runner named by a container's label still lives (a reused pid has another start time)."""
    host, _, rest = label.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's runner: not ours to judge
    return _start_time(int(pid)) == started


def _client(timeout: int = 30):
    try:
        import docker
    except ImportError:
        raise SandboxError("the docker sandbox needs the docker SDK: pip install 'clawgym[docker]'") from None
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except Exception as e:  # the SDK raises several types when no engine answers
        raise SandboxError(f"no Docker engine reachable ({type(e).__name__}); start one (scripts/docker-engine.sh start) "
                           f"or use the local sandbox") from None


def reap_leftovers(client) -> int:
    """Remove the containers (and host folders) that runners no longer alive left behind; how many."""
    n = 0
    for c in client.containers.list(all=True, filters={"label": LABEL_RUNNER}):
        if _alive(c.labels.get(LABEL_RUNNER, "")):
            continue
        try:
            c.remove(force=True)
            n += 1
        except Exception:
            continue  # removed by someone else meanwhile
        root = c.labels.get(LABEL_ROOT)
        if root and Path(root).is_dir():
            rmtree(Path(root))
    return n


def prepare_engine(image: str) -> str | None:
    """None when an engine answers and has `image` (leftovers of dead runners removed), else what is wrong."""
    try:
        client = _client(timeout=10)
    except SandboxError as e:
        return str(e)
    try:
        client.images.get(image)
    except Exception:
        return (f"image {image!r} is not in the engine; build it (scripts/docker-engine.sh start makes "
                f"{SandboxConfig().image}) or name one with --sandbox docker:IMAGE")
    reap_leftovers(client)
    return None


def runtime_mounts() -> list[tuple[str, str]]:
    """(host path, path inside), read-only: what the relay and the harnesses run with.

    A Python in its own prefix (a venv, pyenv, conda) is mounted whole; a system one (/usr) by its
    parts (the interpreter, libpython, the folders on sys.path), so the image's own /usr stays."""
    out: list[tuple[str, str]] = []

    def add(host: Path, inside: str | None = None) -> None:
        inside = inside or str(host)
        covered = inside == str(host) and any(h == i and host.is_relative_to(h) for h, i in out)
        if host.exists() and not covered:
            out.append((str(host), inside))

    prefixes = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    for prefix in dict.fromkeys(prefixes):
        if str(prefix) not in _SYSTEM_PREFIXES:
            add(prefix)
    if any(str(q) in _SYSTEM_PREFIXES for q in prefixes):
        exe = Path(sys.executable)
        add(exe.resolve())
        if exe.resolve() != exe:
            add(exe.resolve(), str(exe))  # the name harnesses are launched by
        if sysconfig.get_config_var("Py_ENABLE_SHARED"):
            add(Path(sysconfig.get_config_var("LIBDIR") or "/", sysconfig.get_config_var("LDLIBRARY") or "-").resolve())
        for entry in sys.path:
            if entry and Path(entry).is_dir():
                add(Path(entry).resolve())
    add(PACKAGE_ROOT)

    add((clawgym_home() / "harnesses").resolve())
    if (node := shutil.which("node")) is not None:
        add(Path(node).resolve(), f"{INSIDE}/bin/node")
    return out


class DockerSandbox:
    kind = "docker"
    network = "none"

    def __init__(self, seed: Path | None, config: SandboxConfig, sandbox_id: str | None = None):
        self.config = config
        self.id = sandbox_id or uuid.uuid4().hex[:12]
        self._servers: list = []
        self._closed = False
        self._n = 0
        self._lock = threading.Lock()
        self.container = None
        self.root = None
        self.client = _client()
        config.base_dir.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.id}-", dir=config.base_dir)).resolve()
        self.marker = self.root.name  # unique on this machine, as the local sandbox's
        try:
            self._setup(seed)
        except BaseException:
            self.close()
            raise

    def _setup(self, seed: Path | None) -> None:
        import docker

        self.workspace, self.tests, self.logs = self.root / "workspace", self.root / "tests", self.root / "logs"
        self.harbor_logs, self.net, self.files = self.root / "harbor-logs", self.root / "net", self.root / "files"
        self.home = self.root / "home"
        seed_workspace(seed, self.workspace)
        for d in (self.tests, self.logs, self.harbor_logs / "verifier", self.harbor_logs / "agent", self.net, self.files, self.home):
            d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(RELAY, self.net / "relay.py")
        # /sandbox/bin, first on PATH: `python3` and `python` are the runner's Python, as on the host
        # (the verifier and the agents' tools use them), and `node` the host's
        self.bin = self.root / "bin"
        self.bin.mkdir()
        for name in ("python3", "python"):
            (self.bin / name).write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
            (self.bin / name).chmod(0o755)
        (self.bin / "node").touch()  # the mount point of the host's node
        self.blackhole = BlackHole()
        self._servers.append(self.blackhole)
        self._forwards = self._bridge("b.sock", self.blackhole.port, tcp=("127.0.0.1", self.blackhole.port))
        p = self.config.proxy
        if p is not None:
            self._forwards += self._bridge("p.sock", p.port, tcp=None if p.unix_path else (p.host, p.port), unix=p.unix_path)
        self._inside = [(self.workspace, self.config.workdir), (self.tests, "/tests"), (self.harbor_logs, "/logs")]
        self._inside += [(d, f"{INSIDE}/{d.name}") for d in (self.net, self.files, self.home, self.logs)]
        volumes = [f"{h}:{c}:rw" for h, c in self._inside] + [f"{self.bin}:{INSIDE}/bin:ro"]
        volumes += [f"{h}:{c}:ro" for h, c in runtime_mounts()]
        lim = self.config.limits
        try:
            self.container = self.client.containers.run(
                self.config.image, ["sleep", "infinity"], detach=True, init=True, network_mode="none",
                volumes=volumes, working_dir=self.config.workdir, user=f"{os.getuid()}:{os.getgid()}",
                labels={"clawgym.sandbox": self.id, LABEL_RUNNER: runner_label(), LABEL_ROOT: str(self.root)},
                mem_limit=f"{lim.memory_mb}m" if lim.memory_mb else None,
                nano_cpus=int(self.config.cpus * 1e9) if self.config.cpus else None, pids_limit=lim.processes,
            )
        except docker.errors.DockerException as e:
            raise SandboxError(f"cannot start a container from image {self.config.image!r}: {e}") from None

    def _bridge(self, name: str, inside_port: int, *, tcp=None, unix=None) -> list[str]:
        self._servers.append(UnixBridge(str(self.net / name), tcp=tcp, unix=unix))
        return ["--forward", f"127.0.0.1:{inside_port}={INSIDE}/net/{name}"]

    def base_env(self) -> dict[str, str]:
        bh = f"http://127.0.0.1:{self.blackhole.port}"
        env = {"PATH": f"{INSIDE}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": f"{INSIDE}/home", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb",
               "CLAWGYM_WORKSPACE": self.config.workdir, "NO_PROXY": "127.0.0.1,localhost,::1", "no_proxy": "127.0.0.1,localhost,::1"}
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[k] = env[k.lower()] = bh
        return {**env, **self.config.env}

    def path_inside(self, host_path: Path) -> str:
        host_path = Path(host_path).resolve()
        for host, inside in self._inside:
            if host_path.is_relative_to(host):
                return str(Path(inside) / host_path.relative_to(host))
        raise SandboxError(f"{host_path} is not visible inside the container")

    def run(self, cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: str | None = None,
            name: str = "run", stdin: bytes | None = None) -> RunResult:
        if stdin is not None:
            raise SandboxError("the docker sandbox does not pass stdin; write a file with put_file instead")
        work = (self.workspace / cwd).resolve() if cwd else self.workspace
        if not work.is_relative_to(self.workspace):
            raise SandboxError(f"run: cwd {cwd!r} is outside the sandbox")
        with self._lock:
            if self._closed or self.container is None:
                raise SandboxError(f"sandbox {self.id} is closed")
            self._n += 1
            base = f"{name}-{self._n}"
        out, err = self.logs / f"{base}.stdout", self.logs / f"{base}.stderr"
        # The output goes to files in the mounted logs folder, not through the engine's stream (an
        # attach stream breaks on the client's read timeout when a command is silent for long).
        argv = ["sh", "-c", 'exec "$@" >"$0.stdout" 2>"$0.stderr"', f"{INSIDE}/logs/{base}",
                sys.executable, "-I", "-S", f"{INSIDE}/net/relay.py", "relay", *limit_args(self.config.limits),
                *self._forwards, "--", *map(str, cmd)]
        full_env = {**self.base_env(), **(env or {}), MARKER: self.marker}
        api = self.client.api
        t0 = time.monotonic()
        try:
            exec_id = api.exec_create(self.container.id, argv, environment=full_env, workdir=self.path_inside(work))["Id"]
            api.exec_start(exec_id, detach=True)
        except Exception as e:
            if self._closed:
                return RunResult(None, False, out, err, time.monotonic() - t0, cancelled=True)
            raise SandboxError(f"cannot run {cmd[0]!r} in container {self.container.id[:12]}: {type(e).__name__}: {e}") from None
        code, timed_out, pause = None, False, 0.005
        while True:
            if self._closed:
                kill_marked(self.marker)
                return RunResult(None, False, out, err, time.monotonic() - t0, cancelled=True)
            try:
                info = api.exec_inspect(exec_id)
            except Exception as e:
                if self._closed:
                    continue
                kill_marked(self.marker)  # the engine is gone; what it ran must not outlive the rollout
                raise SandboxError(f"the Docker engine stopped answering while {cmd[0]!r} ran ({type(e).__name__})") from None
            if not info.get("Running") and info.get("ExitCode") is not None:
                code = info["ExitCode"]
                break
            if time.monotonic() - t0 >= timeout:
                timed_out = True
                kill_marked(self.marker, self.config.kill_grace_s, signal.SIGTERM)
                kill_marked(self.marker)
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        return RunResult(None if timed_out else code, timed_out, out, err, time.monotonic() - t0)

    def put_file(self, rel: str, data: bytes) -> str:
        path = (self.files / rel).resolve()
        if not path.is_relative_to(self.files) or rel.startswith("/"):
            raise SandboxError(f"put_file: {rel!r} leaves the sandbox's private folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return self.path_inside(path)

    def install_tests(self, tests_dir: Path) -> str:
        for p in self.tests.iterdir():  # the mount point stays; its content is replaced
            rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        if tests_dir is not None and Path(tests_dir).is_dir():
            shutil.copytree(tests_dir, self.tests, symlinks=False, dirs_exist_ok=True)
        return "/tests"

    def blocked_attempts(self) -> list[BlockedAttempt]:
        return list(self.blackhole.attempts) if getattr(self, "blackhole", None) else []

    def close(self) -> None:
        with self._lock:
            self._closed = True
            container, self.container = self.container, None
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:
                pass  # already gone, or the engine is: the marked processes are killed below
        if self.root is not None:
            kill_marked(self.marker)
        for s in self._servers:
            s.close()
        self._servers = []
        if not self.config.keep and self.root is not None and self.root.exists():
            rmtree(self.root)

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
