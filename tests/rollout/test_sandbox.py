"""The local sandbox: seeding, process-group kills, cleanup, limits, isolation and the network.

Network tests never send traffic off this machine: outside addresses are tried only through the
black-hole proxy (which records them) or from inside a network namespace with no route out."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from clawgym.rollout.sandbox import ProxyEndpoint, Sandbox, SandboxConfig, SandboxError, open_sandbox
from clawgym.rollout.sandbox_local import MARKER, namespace_problem

NAMESPACE_MODES = [
    pytest.param(m, marks=pytest.mark.skipif(namespace_problem(m) is not None, reason=f"{m}: {namespace_problem(m)}"))
    for m in ("bwrap", "unshare")
]
ALL_MODES = [*NAMESPACE_MODES, "blackhole"]


def settles(condition, within: float = 10.0) -> bool:
    """Whether `condition()` holds within `within` seconds (polled): waits on the state, not a fixed sleep."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def marked_pids(marker: str) -> list[int]:
    """Live processes carrying the sandbox's marker in their environment."""
    needle = f"{MARKER}={marker}\0".encode()
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/environ", "rb") as f:
                    if needle in f.read() + b"\0":
                        with open(f"/proc/{e}/stat") as s:
                            if s.read().split(")")[-1].split()[0] != "Z":
                                out.append(int(e))
            except OSError:
                pass
    return out


@pytest.fixture
def cfg(tmp_path: Path) -> SandboxConfig:
    return SandboxConfig(base_dir=tmp_path / "sb", network="blackhole", kill_grace_s=0.5)


def test_seeded_workspace_home_and_logs(tmp_path: Path, cfg: SandboxConfig) -> None:
    seed = tmp_path / "seed"
    (seed / "sub").mkdir(parents=True)
    (seed / "sub" / "a.txt").write_text("seed")
    with open_sandbox("local", seed, cfg) as sb:
        assert isinstance(sb, Sandbox)
        r = sb.run(["sh", "-c", 'cat sub/a.txt; echo " $HOME $TMPDIR"; pwd; echo oops >&2; exit 3'], timeout=10)
        assert r.exit_code == 3 and not r.timed_out and not r.ok
        text = r.stdout()
        assert text.startswith("seed ") and str(sb.root / "home") in text and str(sb.root / "tmp") in text
        assert str(sb.workspace) in text and r.stderr().strip() == "oops"
        assert r.stdout_path.parent == sb.logs
        (sb.workspace / "new.txt").write_text("x")
    assert (seed / "sub" / "a.txt").read_text() == "seed" and not (seed / "new.txt").exists()


def test_host_secrets_do_not_leak_into_env(cfg: SandboxConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with open_sandbox("local", None, cfg) as sb:
        assert "sk-secret" not in sb.run(["env"], timeout=10).stdout()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_timeout_kills_whole_group(tmp_path: Path, mode: str) -> None:
    cfg = SandboxConfig(base_dir=tmp_path / "sb", network=mode, kill_grace_s=0.5)
    with open_sandbox("local", None, cfg) as sb:
        t0 = time.monotonic()
        r = sb.run(["sh", "-c", "trap '' TERM; sleep 300 & sleep 300 & wait"], timeout=1)
        assert r.timed_out and r.exit_code is None and time.monotonic() - t0 < 10
        assert marked_pids(sb.marker) == []


def test_missing_command_is_a_sandbox_error(cfg: SandboxConfig) -> None:
    with open_sandbox("local", None, cfg) as sb:
        with pytest.raises(SandboxError, match="not found"):
            sb.run(["no-such-harness-binary"], timeout=5)
        with pytest.raises(SandboxError, match="outside"):
            sb.run(["true"], timeout=5, cwd="../..")
        with pytest.raises(SandboxError, match="leaves"):
            sb.put_file("../../escape", b"x")


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_namespace_proxy_reachable_outside_refused(tmp_path: Path, fake_proxy: int, mode: str) -> None:
    cfg = SandboxConfig(base_dir=tmp_path / "sb", network=mode, proxy=ProxyEndpoint(port=fake_proxy))
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
    s.connect(("192.0.2.1", 80))  # inside the namespace there is no route: fails locally
    print("DIRECT-CONNECTED")
except OSError as e:
    print("direct-refused", e.errno)
"""
    with open_sandbox("local", None, cfg) as sb:
        assert sb.network == mode
        r = sb.run(["python3", "-c", code], timeout=30)
        out = r.stdout()
        assert r.exit_code == 0, r.stderr()
        assert "proxy says hi" in out and "via-proxy-refused" in out and "direct-refused" in out and "DIRECT" not in out
        assert [(a.method, a.target) for a in sb.blocked_attempts()] == [("CONNECT", "192.0.2.1:443")]


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_proxy_on_a_unix_socket(tmp_path: Path, mode: str) -> None:
    """A proxy that listens on a Unix socket is reached at 127.0.0.1:<port> inside, like a TCP one."""
    import socketserver

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"unix")

        def address_string(self):
            return "unix"

        def log_message(self, *a):
            pass

    class UnixHTTP(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    path = str(tmp_path / "proxy.sock")
    srv = UnixHTTP(path, H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = SandboxConfig(base_dir=tmp_path / "sb", network=mode, proxy=ProxyEndpoint(port=18777, unix_path=path))
        with open_sandbox("local", None, cfg) as sb:
            r = sb.run(["python3", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:18777/').read().decode())"], timeout=20)
            assert r.stdout().strip() == "unix", r.stderr()
    finally:
        srv.shutdown()


def test_blackhole_refuses_and_counts(tmp_path: Path, fake_proxy: int) -> None:
    cfg = SandboxConfig(base_dir=tmp_path / "sb", network="blackhole", proxy=ProxyEndpoint(port=fake_proxy))
    code = f"""
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:{fake_proxy}/").read().decode())
for url in ("http://192.0.2.1/x", "https://192.0.2.1/y"):
    try:
        urllib.request.urlopen(url, timeout=5)
    except Exception as e:
        print("refused", e)
"""
    with open_sandbox("local", None, cfg) as sb:
        r = sb.run(["python3", "-c", code], timeout=30)
        assert r.stdout().count("refused") == 2 and "proxy says hi" in r.stdout()
        assert sorted((a.method, a.target) for a in sb.blocked_attempts()) == [("CONNECT", "192.0.2.1:443"), ("GET", "http://192.0.2.1/x")]


@pytest.mark.skipif(namespace_problem("bwrap") is not None, reason=f"bwrap: {namespace_problem('bwrap')}")
def test_sandboxes_cannot_see_each_other(tmp_path: Path) -> None:
    cfg = SandboxConfig(base_dir=tmp_path / "sb", network="bwrap")
    with open_sandbox("local", None, cfg) as a, open_sandbox("local", None, cfg) as b:
        (a.workspace / "secret.txt").write_text("a's secret")
        r = b.run(["sh", "-c", f"cat {a.workspace}/secret.txt; ls {cfg.base_dir}; echo hi > {a.workspace}/planted"], timeout=10)
        # b sees neither a's folder nor its own host folder: its files are at fixed paths
        assert "a's secret" not in r.stdout() and r.stdout().split() == []
        assert not (a.workspace / "planted").exists()
        r = b.run(["sh", "-c", "echo x > /etc/clawgym-test || echo readonly"], timeout=10)
        assert "readonly" in r.stdout() and not Path("/etc/clawgym-test").exists()


@pytest.mark.skipif(namespace_problem("bwrap") is not None, reason=f"bwrap: {namespace_problem('bwrap')}")
def test_hidden_task_folders_are_masked(tmp_path: Path) -> None:
    # Outside /tmp (which bwrap hides anyway), so that only `hide` can mask it.
    root = Path(tempfile.mkdtemp(prefix="clawgym-test-tasks-", dir="/var/tmp"))
    try:
        (root / "t1" / "tests").mkdir(parents=True)
        (root / "t1" / "tests" / "check.py").write_text("the answer key")
        cmd = ["sh", "-c", f"cat {root}/t1/tests/check.py; echo; ls -A {root} | wc -l"]
        for hide, visible in (([], True), ([root], False)):
            cfg = SandboxConfig(base_dir=tmp_path / "sb", network="bwrap", hide=hide)
            with open_sandbox("local", None, cfg) as sb:
                out = sb.run(cmd, timeout=10).stdout()
                assert ("answer key" in out) == visible and (out.split()[-1] == "0") != visible
    finally:
        shutil.rmtree(root)


def _docker_problem() -> str | None:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return None
    except Exception as e:
        return f"no Docker engine reachable here ({type(e).__name__})"


def test_docker_without_engine_is_a_clear_error(tmp_path: Path) -> None:
    if _docker_problem() is None:
        pytest.skip("a Docker engine runs here")
    # Without the docker SDK the message names the missing package instead; both are one clear line.
    expected = "no Docker engine reachable" if importlib.util.find_spec("docker") else r"needs the docker SDK: pip install"
    with pytest.raises(SandboxError, match=expected):
        open_sandbox("docker", None, SandboxConfig(base_dir=tmp_path / "sb"))


def test_two_sandboxes_with_the_same_id_do_not_kill_each_others_processes(tmp_path: Path) -> None:
    # Two runs on one machine use the same rollout ids; closing one sandbox must leave the other's
    # processes alone (its marker is unique, not the id).
    import threading

    cfg = SandboxConfig(base_dir=tmp_path / "sb", network="blackhole")
    a, b = open_sandbox("local", None, cfg, sandbox_id="same.id.0"), open_sandbox("local", None, cfg, sandbox_id="same.id.0")
    try:
        assert a.marker != b.marker
        result = {}
        t = threading.Thread(target=lambda: result.setdefault("b", b.run(["sleep", "3"], timeout=30)))
        t.start()
        assert settles(lambda: marked_pids(b.marker) != [])  # b's sleep runs before a closes
        a.close()
        t.join()
        assert result["b"].exit_code == 0 and not result["b"].cancelled
    finally:
        a.close()
        b.close()


BWRAP = pytest.mark.skipif(namespace_problem("bwrap") is not None, reason=f"bwrap: {namespace_problem('bwrap')}")


@BWRAP
def test_bwrap_shows_one_fixed_layout_in_every_sandbox(tmp_path: Path) -> None:
    """Two sandboxes of one task show their commands the same paths: no random host folder reaches
    the harness (its working directory goes into the prompt), and writes still land on the host."""
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "a.txt").write_text("seed")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "check.py").write_text("print(1)")
    cfg = SandboxConfig(base_dir=tmp_path / "sb", network="bwrap")
    script = 'pwd; echo "$HOME $TMPDIR $CLAWGYM_WORKSPACE"; cat a.txt; echo; echo out > b.txt; touch "$HOME/h" "$TMPDIR/t"; ' \
             'touch /x 2>/dev/null || echo root-ro; ls "$0" 2>/dev/null || echo host-hidden'
    seen = []
    for _ in range(2):
        with open_sandbox("local", seed, cfg) as sb:
            r = sb.run(["sh", "-c", script, str(sb.root)], timeout=20)
            assert r.exit_code == 0, r.stderr()
            seen.append(r.stdout())
            assert (sb.workspace / "b.txt").read_text() == "out\n" and (sb.home / "h").exists() and (sb.tmp / "t").exists()
            assert sb.path_inside(sb.workspace / "b.txt") == "/workspace/b.txt"
            inside_tests = sb.install_tests(tests)
            note = sb.put_file("verifier/note.txt", b"private")
            r = sb.run(["sh", "-c", f'cat {inside_tests}/check.py "{note}"'], timeout=20)
            assert (inside_tests, note, r.stdout()) == ("/sandbox/tests", "/sandbox/files/verifier/note.txt", "print(1)private")
            with pytest.raises(SandboxError, match="not visible"):
                sb.path_inside(sb.logs)
    assert seen[0] == seen[1] == "/workspace\n/sandbox/home /sandbox/tmp /workspace\nseed\nroot-ro\nhost-hidden\n"


@BWRAP
@pytest.mark.parametrize("workdir", ["workspace", "/tmp/w", "/sandbox", "/usr/w", "/"])
def test_bwrap_refuses_a_workdir_it_cannot_mount(tmp_path: Path, workdir: str) -> None:
    cfg = SandboxConfig(base_dir=tmp_path / "sb", network="bwrap", workdir=workdir)
    with pytest.raises(SandboxError, match="sandbox workdir"):
        open_sandbox("local", None, cfg)
    assert list((tmp_path / "sb").iterdir()) == []  # nothing left behind
