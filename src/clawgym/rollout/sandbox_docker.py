"""The `docker` sandbox: one container per rollout from the project's image (docker SDK).

The workspace, hidden tests and Harbor logs are host folders bind-mounted at `config.workdir`
(default /workspace), /tests and /logs, so the verifier and the runner read results on the host.
The container has no network (`network_mode="none"`); as in the local bwrap mode, every command
runs under the relay (copied in as /sandbox/net/relay.py) that listens on 127.0.0.1:<proxy port>
inside and forwards to a Unix socket bridged to the proxy on the host, and HTTP(S)_PROXY points at
the black hole. Commands get coreutils `timeout` inside and a host-side deadline; close() removes
the container and the folder. Without a reachable engine the constructor raises SandboxError.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Mapping, Sequence

from clawgym.rollout.sandbox_base import RunResult, SandboxConfig, SandboxError, limit_args, rmtree, seed_workspace
from clawgym.rollout.sandbox_local import MARKER, RELAY
from clawgym.rollout.sandbox_net import BlackHole, BlockedAttempt, UnixBridge

INSIDE = "/sandbox"


class DockerSandbox:
    kind = "docker"
    network = "none"

    def __init__(self, seed: Path | None, config: SandboxConfig, sandbox_id: str | None = None):
        try:
            import docker
        except ImportError:
            raise SandboxError("the docker sandbox needs the docker SDK: pip install 'clawgym[docker]'") from None
        self.config = config
        self.id = sandbox_id or uuid.uuid4().hex[:12]
        self._servers: list = []
        self._closed = False
        self._n = 0
        self._lock = threading.Lock()
        self.container = None
        try:
            self.client = docker.from_env(timeout=30)
            self.client.ping()
        except Exception as e:  # the SDK raises several types when no engine answers
            raise SandboxError(f"no Docker engine reachable ({type(e).__name__}: {e}); start one or use the local sandbox") from None
        config.base_dir.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{self.id}-", dir=config.base_dir)).resolve()
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
        self.blackhole = BlackHole()
        self._servers.append(self.blackhole)
        self._forwards = self._bridge("b.sock", self.blackhole.port, tcp=("127.0.0.1", self.blackhole.port))
        p = self.config.proxy
        if p is not None:
            self._forwards += self._bridge("p.sock", p.port, tcp=None if p.unix_path else (p.host, p.port), unix=p.unix_path)
        mounts = {
            str(self.workspace): self.config.workdir, str(self.tests): "/tests", str(self.harbor_logs): "/logs",
            str(self.net): f"{INSIDE}/net", str(self.files): f"{INSIDE}/files", str(self.home): f"{INSIDE}/home",
        }
        lim = self.config.limits
        try:
            self.container = self.client.containers.run(
                self.config.image, ["sleep", "infinity"], detach=True, init=True, network_mode="none",
                volumes={h: {"bind": c, "mode": "rw"} for h, c in mounts.items()}, working_dir=self.config.workdir,
                labels={"clawgym.sandbox": self.id}, mem_limit=f"{lim.memory_mb}m" if lim.memory_mb else None,
                nano_cpus=int(self.config.cpus * 1e9) if self.config.cpus else None, pids_limit=lim.processes,
            )
        except docker.errors.DockerException as e:
            raise SandboxError(f"cannot start a container from image {self.config.image!r}: {e}") from None

    def _bridge(self, name: str, inside_port: int, *, tcp=None, unix=None) -> list[str]:
        self._servers.append(UnixBridge(str(self.net / name), tcp=tcp, unix=unix))
        return ["--forward", f"127.0.0.1:{inside_port}={INSIDE}/net/{name}"]

    def base_env(self) -> dict[str, str]:
        bh = f"http://127.0.0.1:{self.blackhole.port}"
        env = {"HOME": f"{INSIDE}/home", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb", MARKER: self.id,
               "CLAWGYM_WORKSPACE": self.config.workdir, "NO_PROXY": "127.0.0.1,localhost,::1", "no_proxy": "127.0.0.1,localhost,::1"}
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[k] = env[k.lower()] = bh
        return {**env, **self.config.env}

    def path_inside(self, host_path: Path) -> str:
        host_path = Path(host_path).resolve()
        for host, inside in ((self.workspace, self.config.workdir), (self.tests, "/tests"), (self.harbor_logs, "/logs"), (self.files, f"{INSIDE}/files"),
                             (self.home, f"{INSIDE}/home")):
            if host_path.is_relative_to(host):
                return str(Path(inside) / host_path.relative_to(host))
        raise SandboxError(f"{host_path} is not visible inside the container")

    def run(self, cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: str | None = None,
            name: str = "run", stdin: bytes | None = None) -> RunResult:
        if self._closed or self.container is None:
            raise SandboxError(f"sandbox {self.id} is closed")
        if stdin is not None:
            raise SandboxError("the docker sandbox does not pass stdin; write a file with put_file instead")
        with self._lock:
            self._n += 1
            out, err = self.logs / f"{name}-{self._n}.stdout", self.logs / f"{name}-{self._n}.stderr"
        grace = max(1, int(self.config.kill_grace_s))
        argv = ["timeout", "-s", "TERM", "-k", str(grace), f"{timeout:g}", "python3", "-I", "-S", f"{INSIDE}/net/relay.py",
                "relay", *limit_args(self.config.limits), *self._forwards, "--", *map(str, cmd)]
        workdir = str(Path(self.config.workdir) / cwd) if cwd else self.config.workdir
        api = self.client.api
        t0 = time.monotonic()
        try:
            exec_id = api.exec_create(self.container.id, argv, environment={**self.base_env(), **(env or {})}, workdir=workdir)["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=True)
        except Exception as e:
            raise SandboxError(f"cannot run {cmd[0]!r} in container {self.container.id[:12]}: {e}") from None

        def pump() -> None:
            with open(out, "wb") as fo, open(err, "wb") as fe:
                for o, e in stream:
                    fo.write(o or b"")
                    fe.write(e or b"")

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        t.join(timeout + grace + 10)
        if t.is_alive():  # `timeout` inside did not end it: the container is wedged
            self.close()
            raise SandboxError(f"container of sandbox {self.id} did not stop {cmd[0]!r} after {timeout:g}s")
        code = api.exec_inspect(exec_id).get("ExitCode")
        timed_out = code in (124, 137) and time.monotonic() - t0 >= timeout
        return RunResult(None if timed_out else code, timed_out, out, err, time.monotonic() - t0)

    def put_file(self, rel: str, data: bytes) -> str:
        path = (self.files / rel).resolve()
        if not path.is_relative_to(self.files):
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
        self._closed = True
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:
                pass  # already gone; nothing of this rollout runs any more
            self.container = None
        for s in self._servers:
            s.close()
        self._servers = []
        if not self.config.keep and self.root.exists():
            rmtree(self.root)

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
