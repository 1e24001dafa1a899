"""One suite, both isolating backends: the local sandbox under bubblewrap and the docker sandbox
against a real engine (scripts/docker-engine.sh starts one; CI does). Each behaviour the rollouts
rely on is checked on each backend: the fixed workspace path, isolation from the host's files and
from other sandboxes, the network (the proxy and nothing else), resource limits, the kill of the
whole process tree on timeout, the hidden tests copied in only after the harness, cleanup.
A backend that cannot run here skips with the reason."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from clawgym.rollout.sandbox import Limits, ProxyEndpoint, SandboxConfig, SandboxError, open_sandbox
from clawgym.rollout.sandbox_base import marked_pids
from clawgym.rollout.sandbox_docker import prepare_engine
from clawgym.rollout.sandbox_local import namespace_problem

DOCKER_PROBLEM = prepare_engine(SandboxConfig().image)
BWRAP_PROBLEM = namespace_problem("bwrap")
BACKENDS = [
    pytest.param("local", marks=pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap: {BWRAP_PROBLEM}")),
    pytest.param("docker", marks=pytest.mark.skipif(DOCKER_PROBLEM is not None, reason=f"docker: {DOCKER_PROBLEM}")),
]
needs_docker = pytest.mark.skipif(DOCKER_PROBLEM is not None, reason=f"docker: {DOCKER_PROBLEM}")


def settles(condition, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def sandbox(kind: str, tmp_path: Path, **kw):
    kw.setdefault("kill_grace_s", 0.5)
    if kind == "local":
        kw.setdefault("network", "bwrap")
    return open_sandbox(kind, None, SandboxConfig(base_dir=tmp_path / "sb", **kw))


@pytest.mark.parametrize("kind", BACKENDS)
def test_fixed_workspace_path_and_files_owned_by_the_runner(kind: str, tmp_path: Path) -> None:
    with sandbox(kind, tmp_path) as sb:
        assert sb.path_inside(sb.workspace) == "/workspace"
        r = sb.run(["sh", "-c", "pwd; id -u; echo hi > out.txt; mkdir d; echo x > d/y"], timeout=30)
        assert r.exit_code == 0, r.stderr()
        pwd, uid = r.stdout().split()
        assert pwd == "/workspace" and int(uid) == os.getuid()
        for p in (sb.workspace / "out.txt", sb.workspace / "d", sb.workspace / "d" / "y"):
            assert (p.stat().st_uid, p.stat().st_gid) == (os.getuid(), os.getgid())


@pytest.mark.parametrize("kind", BACKENDS)
def test_host_files_and_other_sandboxes_are_out_of_reach(kind: str, tmp_path: Path) -> None:
    # outside /tmp (which bwrap hides anyway) so that only the sandbox can keep it out
    secret_dir = Path(tempfile.mkdtemp(prefix="clawgym-test-host-", dir="/var/tmp"))
    try:
        (secret_dir / "answer.txt").write_text("the answer key")
        with sandbox(kind, tmp_path, hide=[secret_dir]) as a, sandbox(kind, tmp_path, hide=[secret_dir]) as b:
            (a.workspace / "secret.txt").write_text("a's secret")
            script = (f"cat {a.workspace}/secret.txt {secret_dir}/answer.txt; ls {tmp_path / 'sb'}; "
                      f"echo hi > {a.workspace}/planted; echo x > /etc/clawgym-test || echo readonly")
            r = b.run(["sh", "-c", script], timeout=30)
            assert "secret" not in r.stdout() and "answer key" not in r.stdout(), r.stdout()
            # bwrap shows the host's / read-only; a container writes to its own /etc, never the host's
            assert r.stdout().split() == (["readonly"] if kind == "local" else [])
            assert not (a.workspace / "planted").exists() and not Path("/etc/clawgym-test").exists()
    finally:
        shutil.rmtree(secret_dir)


@pytest.mark.parametrize("kind", BACKENDS)
def test_the_proxy_is_reachable_and_nothing_else(kind: str, tmp_path: Path, fake_proxy: int) -> None:
    code = f"""
import socket, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:{fake_proxy}/v1").read().decode())
try:
    urllib.request.urlopen("https://192.0.2.1/", timeout=5)
except Exception as e:
    print("via-proxy-refused", e)
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("192.0.2.1", 80))  # there is no route out: fails locally
    print("DIRECT-CONNECTED")
except OSError as e:
    print("direct-refused", e.errno)
"""
    with sandbox(kind, tmp_path, proxy=ProxyEndpoint(port=fake_proxy)) as sb:
        r = sb.run(["python3", "-c", code], timeout=30)
        out = r.stdout()
        assert r.exit_code == 0, r.stderr()
        assert "proxy says hi" in out and "via-proxy-refused" in out and "direct-refused" in out and "DIRECT" not in out
        assert [(a.method, a.target) for a in sb.blocked_attempts()] == [("CONNECT", "192.0.2.1:443")]


@pytest.mark.parametrize("kind", BACKENDS)
def test_resource_limits(kind: str, tmp_path: Path) -> None:
    with sandbox(kind, tmp_path, limits=Limits(file_size_mb=1, open_files=64)) as sb:
        r = sb.run(["sh", "-c", "ulimit -n; head -c 3000000 /dev/zero > big"], timeout=30)
        assert r.stdout().split()[0] == "64"
        assert r.exit_code != 0 and (sb.workspace / "big").stat().st_size <= 1024 * 1024


@pytest.mark.parametrize("kind", BACKENDS)
def test_timeout_kills_the_whole_process_tree(kind: str, tmp_path: Path) -> None:
    with sandbox(kind, tmp_path) as sb:
        t0 = time.monotonic()
        r = sb.run(["sh", "-c", "trap '' TERM; sleep 300 & setsid sleep 300 & sleep 300 & wait"], timeout=2)
        assert r.timed_out and r.exit_code is None and time.monotonic() - t0 < 15
        assert settles(lambda: marked_pids(sb.marker) == [])
        assert sb.run(["true"], timeout=30).exit_code == 0  # the sandbox itself lives on


@pytest.mark.parametrize("kind", BACKENDS)
def test_hidden_tests_appear_only_when_installed(kind: str, tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "check.py").write_text("print('the real check')")
    with sandbox(kind, tmp_path) as sb:
        r = sb.run(["sh", "-c", f"ls {tests} /tests 2>&1; mkdir -p /tests 2>/dev/null; echo planted > /tests/check.py"], timeout=30)
        assert "check.py" not in r.stdout()
        inside = sb.install_tests(tests)
        r = sb.run(["python3", f"{inside}/check.py"], timeout=30)
        assert r.stdout().strip() == "the real check", r.stderr()


@pytest.mark.parametrize("kind", BACKENDS)
def test_close_kills_everything_removes_files_and_is_idempotent(kind: str, tmp_path: Path) -> None:
    sb = sandbox(kind, tmp_path)
    root = sb.root
    r = sb.run(["sh", "-c", "setsid sleep 300 > /dev/null 2>&1 < /dev/null & mkdir -p ro && touch ro/f && chmod 0 ro/f && chmod 500 ro"], timeout=30)
    assert r.exit_code == 0
    if kind == "docker":  # the daemon outlives its command in the container (bwrap's pid namespace ends with it)...
        assert settles(lambda: len(marked_pids(sb.marker)) == 1)
    container = getattr(sb, "container", None)
    sb.close()
    sb.close()
    assert settles(lambda: marked_pids(sb.marker) == [])  # ...not its sandbox
    assert not root.exists()
    if container is not None:
        assert sb.client.containers.list(all=True, filters={"id": container.id}) == []
    with pytest.raises(SandboxError, match="closed"):
        sb.run(["true"], timeout=5)


@pytest.mark.parametrize("kind", BACKENDS)
def test_close_cancels_a_running_command(kind: str, tmp_path: Path) -> None:
    sb = sandbox(kind, tmp_path)
    threading.Timer(1.0, sb.close).start()
    r = sb.run(["sleep", "60"], timeout=60)
    assert r.cancelled and r.exit_code is None and not r.timed_out and r.wall_time_s < 30


# --- the docker engine's own failure modes --------------------------------------------------------

LEFTOVER = """
import sys, time
from pathlib import Path
from clawgym.rollout.sandbox import SandboxConfig, open_sandbox
sb = open_sandbox("docker", None, SandboxConfig(base_dir=Path(sys.argv[1])))
print(sb.container.id, sb.root, flush=True)
time.sleep(600)
"""


@needs_docker
def test_a_sigkilled_runners_container_is_reaped_by_the_next_run(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    import docker

    from clawgym.rollout.sandbox import isolation

    p = subprocess.Popen([sys.executable, "-c", LEFTOVER, str(tmp_path / "sb")], stdout=subprocess.PIPE, text=True)
    cid, root = p.stdout.readline().split()
    p.send_signal(signal.SIGKILL)
    p.wait()
    client = docker.from_env()
    assert [c.id for c in client.containers.list(filters={"id": cid})] == [cid] and Path(root).is_dir()
    iso = isolation("docker")  # what the next rollout run does first
    assert iso.files and iso.network == "none"
    assert client.containers.list(all=True, filters={"id": cid}) == [] and not Path(root).exists()


class _Gate:
    """A Unix-socket forwarder in front of the engine's socket that can vanish, connections and all:
    to the sandbox, the engine going away."""

    def __init__(self, path: str, engine: str):
        import socket

        from clawgym.rollout.sandbox_net import splice

        self.conns: list = []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(16)
        self.sock_path = path

        def serve():
            while True:
                try:
                    c, _ = self.sock.accept()
                except OSError:
                    return
                e = socket.socket(socket.AF_UNIX)
                e.connect(engine)
                self.conns += [c, e]
                threading.Thread(target=splice, args=(c, e), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()

    def close(self) -> None:
        import socket

        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop; a bare close() would not
        except OSError:
            pass
        self.sock.close()
        os.unlink(self.sock_path)
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@needs_docker
def test_the_engine_going_away_mid_command_is_a_sandbox_error_not_a_hang(tmp_path: Path, monkeypatch) -> None:
    engine = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    gate = _Gate(str(tmp_path / "gate.sock"), engine)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'gate.sock'}")
    sb = sandbox("docker", tmp_path)
    try:
        threading.Timer(1.5, gate.close).start()
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="stopped answering"):
            sb.run(["sleep", "60"], timeout=60)
        assert time.monotonic() - t0 < 30
        assert settles(lambda: marked_pids(sb.marker) == [])  # what it ran does not outlive the rollout
    finally:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{engine}")
        cid = sb.container.id
        sb.close()
        import docker

        docker.from_env().containers.get(cid).remove(force=True) if docker.from_env().containers.list(filters={"id": cid}) else None
