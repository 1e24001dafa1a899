"""Network plumbing of the local sandbox: a black-hole HTTP(S) proxy, Unix-socket bridges, and the
relay that runs inside a private network namespace.

    harness ──► 127.0.0.1:P (relay, inside the namespace) ──► ROOT/net/proxy.sock (bridge, host)
                                                                 └──► the serving proxy (TCP or Unix)
    harness ──► HTTPS_PROXY=127.0.0.1:B ──► relay ──► ROOT/net/blackhole.sock ──► BlackHole (403, counted)

Inside a namespace nothing but loopback exists, so direct connections to outside addresses fail
locally; clients that honour HTTP(S)_PROXY reach the black hole, which refuses and records them.
Without a namespace the black hole is all there is (the harness is then trusted to use the env).

`python3 -I -S sandbox_net.py relay [--limit as=N ...] [--forward 127.0.0.1:P=/path.sock ...] -- CMD`
sets resource limits, brings loopback up, listens, runs CMD and exits with its status. It is run
by file path and imports only the standard library, so it starts fast inside every sandbox.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

_BLOCK_BODY = b"clawgym sandbox: outside network access is blocked\n"


@dataclass(frozen=True)
class BlockedAttempt:
    """One refused request: CONNECT host:port, or an absolute-URL request through the proxy."""

    method: str
    target: str
    time: float


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides are done, then close both."""
    t = threading.Thread(target=_pump, args=(b, a), daemon=True)
    t.start()
    _pump(a, b)
    t.join()
    a.close()
    b.close()


class _Server:
    """A listening socket with an accept loop on a daemon thread; `handle` runs per connection."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._guard, args=(conn,), daemon=True).start()

    def _guard(self, conn: socket.socket) -> None:
        try:
            self.handle(conn)
        except OSError:
            conn.close()

    def handle(self, conn: socket.socket) -> None:  # pragma: no cover - overridden
        conn.close()

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class BlackHole(_Server):
    """An HTTP(S) proxy on 127.0.0.1 that answers every request 403 and records it."""

    def __init__(self, host: str = "127.0.0.1"):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
        sock.listen(64)
        self.host, self.port = sock.getsockname()
        self.attempts: list[BlockedAttempt] = []
        self._lock = threading.Lock()
        super().__init__(sock)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def handle(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        head = b""
        try:
            while b"\r\n" not in head and len(head) < 8192:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
        except OSError:
            pass
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        method, target = (parts[0], parts[1]) if len(parts) >= 2 else ("RAW", head[:64].decode("latin-1"))
        with self._lock:
            self.attempts.append(BlockedAttempt(method, target, time.time()))
        try:
            conn.sendall(
                b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                + f"Content-Length: {len(_BLOCK_BODY)}\r\n\r\n".encode() + _BLOCK_BODY
            )
        except OSError:
            pass
        conn.close()


class UnixBridge(_Server):
    """Listens on a Unix socket (reachable inside the sandbox) and forwards each connection to a
    TCP (host, port) or another Unix socket on the host."""

    def __init__(self, path: str, *, tcp: tuple[str, int] | None = None, unix: str | None = None):
        if (tcp is None) == (unix is None):
            raise ValueError("UnixBridge needs exactly one of tcp= or unix=")
        self.path, self.tcp, self.unix = path, tcp, unix
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(64)
        super().__init__(sock)

    def handle(self, conn: socket.socket) -> None:
        if self.tcp is not None:
            out = socket.create_connection(self.tcp, timeout=10)
        else:
            out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            out.connect(self.unix)
        out.settimeout(None)
        splice(conn, out)

    def close(self) -> None:
        super().close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------
# Inside the namespace
# ---------------------------------------------------------------------------------------------


def loopback_up() -> None:
    """Bring `lo` up (a fresh `unshare -n` namespace starts with it down; bwrap's is up already)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifr = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr)[:18])[1]  # SIOCGIFFLAGS
        if not flags & 0x1:  # IFF_UP
            fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 0x1))  # SIOCSIFFLAGS
    finally:
        s.close()


class _TcpToUnix(_Server):
    def __init__(self, host: str, port: int, path: str):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        self.path = path
        super().__init__(sock)

    def handle(self, conn: socket.socket) -> None:
        out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        out.connect(self.path)
        splice(conn, out)


LIMIT_NAMES = {"as": "RLIMIT_AS", "cpu": "RLIMIT_CPU", "fsize": "RLIMIT_FSIZE", "nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC", "core": "RLIMIT_CORE"}


def _apply_limits(specs: list[str]) -> None:
    import resource

    for spec in specs:
        name, value = spec.split("=", 1)
        res = getattr(resource, LIMIT_NAMES[name])
        v = int(value)
        _, hard = resource.getrlimit(res)
        # Never try to raise a hard limit (EPERM for non-root); lower it to the value instead.
        hard = v if hard == resource.RLIM_INFINITY or v < hard else hard
        resource.setrlimit(res, (min(v, hard), hard))


def relay_main(argv: list[str]) -> int:
    """Set resource limits, start the loopback listeners, run the command; exit with its status.

    Limits are set here rather than in a preexec_fn, which is unsafe in a threaded parent (the
    rollout runner runs many sandboxes from threads). With no forwards the command is exec'd.
    """
    ap = argparse.ArgumentParser(prog="clawgym-relay")
    ap.add_argument("--forward", action="append", default=[], help="HOST:PORT=/unix.sock")
    ap.add_argument("--limit", action="append", default=[], help=f"NAME=VALUE, NAME in {sorted(LIMIT_NAMES)}")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("clawgym-relay: no command given", file=sys.stderr)
        return 2
    _apply_limits(args.limit)
    if not args.forward:
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            print(f"clawgym-relay: cannot start {cmd[0]!r}: {e}", file=sys.stderr)
            return 127
    loopback_up()
    for spec in args.forward:
        addr, path = spec.split("=", 1)
        host, port = addr.rsplit(":", 1)
        _TcpToUnix(host, int(port), path)
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"clawgym-relay: cannot start {cmd[0]!r}: {e}", file=sys.stderr)
        return 127
    # Pass termination on, so the harness gets a chance to flush before the group is killed.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    if sys.argv[1:2] == ["relay"]:
        sys.exit(relay_main(sys.argv[2:]))
    print("usage: python -m clawgym.rollout.sandbox_net relay --forward HOST:PORT=SOCK ... -- CMD ...", file=sys.stderr)
    sys.exit(2)
