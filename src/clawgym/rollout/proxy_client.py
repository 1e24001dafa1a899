"""The rollout runner's view of the serving proxy: register, settle, close rollouts and collect their calls.

The runner talks to the proxy only through its admin HTTP routes (admin token, the one client in
proxy/client.py), whether the proxy runs in this process (`start_local_proxy`, records under the
run's output folder) or elsewhere on this machine (`ProxyClient.connect`, with the folder the proxy
records into). `sync_weights` (`clawgym sync`) hands a new checkpoint to a running proxy through
the same admin client.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from clawgym import artifacts as A
from clawgym.console import STDERR
from clawgym.engines.registry import check_engine
from clawgym.errors import UserError
from clawgym.models.templates import load_chat_template
from clawgym.proxy.client import AdminClient, ProxyUnavailable
from clawgym.proxy.config import ProxyConfig
from clawgym.proxy.recorder import read_records
from clawgym.proxy.toolparse import check_name

__all__ = ["ProxyClient", "ProxyUnavailable", "SyncResult", "check_proxy_settings", "reachable_host", "start_local_proxy",
           "sync_weights"]


class ProxyClient(AdminClient):
    """The admin client (proxy/client.py), plus where the proxy records: the runner reads the records."""

    def __init__(self, url: str, admin_token: str, records: Path | None = None):
        super().__init__(url, admin_token)
        self.records = Path(records) if records is not None else Path(".")
        """the folder the proxy records into (read by collect_calls; a client that only reloads needs none)"""

    @classmethod
    @contextlib.contextmanager
    def connect(cls, config) -> Iterator["ProxyClient"]:
        if not config.proxy_url or not config.admin_token or not config.records:
            raise UserError("give --model DIR (a proxy in this process), or --proxy URL with --admin-token and --records DIR")
        client = cls(config.proxy_url, config.admin_token, config.records)
        client.admin("GET", "/admin/health")  # a wrong URL or token fails here, before any rollout starts
        yield client

    def discard_records(self, rollout_id: str) -> None:
        """Drop what an unfinished earlier attempt of this rollout recorded, so it reruns cleanly."""
        (self.records / f"{rollout_id}.jsonl").unlink(missing_ok=True)

    def collect_calls(self, rollout_ids: list[str], copy_to: Path | None = None) -> list[A.CallRecord]:
        """The settled records of these rollouts; with `copy_to`, their raw JSONL is kept there too."""
        import shutil


        calls: list[A.CallRecord] = []
        for rid in rollout_ids:
            path = self.records / f"{rid}.jsonl"
            if path.exists():
                calls += read_records(path)
                if copy_to is not None and copy_to.resolve() != self.records.resolve():
                    copy_to.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, copy_to / path.name)
        return calls


@dataclass
class SyncResult:
    """What `clawgym sync` reports: the proxy now serves `checkpoint` as `policy_version`."""

    proxy: str
    checkpoint: Path
    policy_version: int
    previous_version: int
    seconds: float


def sync_weights(url: str, admin_token: str | None, checkpoint: Path, timeout: float = 600.0) -> SyncResult:
    """Make the proxy at `url` reload its engine's weights from `checkpoint`, and return once the
    new policy version serves. Every failure is a one-line UserError naming its cause."""
    if not admin_token:
        raise UserError("give the proxy's admin token with --admin-token or CLAWGYM_ADMIN_TOKEN (serve-proxy prints it when it made one)")
    # The proxy resolves a relative path against its own working folder: send an absolute one when
    # the checkpoint is on this machine (a remote proxy's path is sent as given).
    ckpt = Path(checkpoint).resolve() if Path(checkpoint).exists() else Path(checkpoint)
    client = AdminClient(url, admin_token)
    started = time.monotonic()
    try:
        before = int(client.admin("GET", "/admin/health")["policy_version"])
        version = int(client.admin("POST", "/admin/reload", {"checkpoint": str(ckpt)}, timeout=timeout)["policy_version"])
        # The engines answer the reload once the new weights are in place; poll anyway, so that
        # "synced" always means the proxy reports the new version.
        deadline = started + timeout
        while (served := int(client.admin("GET", "/admin/health")["policy_version"])) < version:
            if time.monotonic() > deadline:
                raise UserError(f"proxy at {client.url} still serves policy version {served}, not {version}, after {timeout:.0f} s")
            time.sleep(0.1)
    except ProxyUnavailable as e:
        if e.status == 401:
            raise UserError(f"proxy at {client.url} refused the admin token (give the one serve-proxy was started with)") from None
        if e.status is not None:
            raise UserError(f"proxy at {client.url} could not load checkpoint {ckpt}: {e.reason}") from None
        raise UserError(f"no proxy answers at {client.url}: {str(e).split(': ', 1)[-1]}") from None
    return SyncResult(client.url, ckpt, served, before, time.monotonic() - started)


def check_proxy_settings(config) -> None:
    """Refuse, in one line and before anything is written or started, what the proxy a rollout uses would
    refuse later: no proxy at all, an unknown engine or tool parser, a missing chat template or script."""
    if not config.model:
        if not config.proxy_url or not config.admin_token or not config.records:
            raise UserError("give --model DIR (a proxy in this process), or --proxy URL with --admin-token and --records DIR")
        return
    check_engine(config.engine, dict(config.engine_options))
    check_name(config.tool_parser)
    if config.chat_template:
        load_chat_template(config.chat_template)
    if config.engine == "scripted" and "script" not in config.engine_options:
        raise UserError("--engine scripted answers from a script: give --script FILE (its format: docs/engines.md)")


@contextlib.contextmanager
def start_local_proxy(config, records: Path) -> Iterator[ProxyClient]:
    """A proxy serving `config.model` on a free port of `config.proxy_host` for the length of the run,
    recording into `records` (a StepLayout's or RunLayout's records folder)."""
    from clawgym.proxy.thread import ProxyThread  # here: a run against a running proxy never loads the server (aiohttp)

    records = Path(records)
    pc = ProxyConfig(model_dir=Path(config.model), engine=config.engine, host=config.proxy_host, port=0,
                     records_dir=records, engine_options=dict(config.engine_options), policy_version=config.policy_version,
                     tool_parser=config.tool_parser, chat_template=config.chat_template)
    with ProxyThread(pc) as thread:
        url = f"http://{reachable_host(config.proxy_host)}:{thread.server.port}"
        server = thread.server
        STDERR.print(f"proxy: serving {config.model} ({config.engine}), tool parser {server.tool_parser}: "
                     f"{server.tool_parser_source}", highlight=False, soft_wrap=True)
        yield ProxyClient(url, thread.server.admin_token, records)


def reachable_host(bind: str) -> str:
    """The address other machines use for a server bound to `bind`: itself, or for a wildcard
    (0.0.0.0, ::) this machine's address as Ray sees it (the one its nodes already use to reach
    this one), else the address of the interface with the default route."""
    if bind not in ("0.0.0.0", "::", ""):
        return bind
    try:
        import ray.util

        return ray.util.get_node_ip_address()
    except ImportError:
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outbound interface
            return s.getsockname()[0]
