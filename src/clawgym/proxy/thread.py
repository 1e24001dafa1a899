"""`ProxyThread`: a ProxyServer on its own event loop in a background thread, for the runners that
serve a policy in-process (`clawgym rollout --model`, `clawgym run`) and for tests. Every admin call
goes over HTTP through `AdminClient`, as an out-of-process runner's would."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from clawgym.engines.base import Engine
from clawgym.proxy.client import AdminClient
from clawgym.proxy.config import ProxyConfig
from clawgym.proxy.server import ProxyServer


class ProxyThread:
    """Run a ProxyServer on its own event loop in a background thread (tests, in-process runners).

        with ProxyThread(config) as proxy:
            rollout = proxy.register("r1")   # -> {"rollout_id", "base_url", "openai_base_url", "api_key"}
    """

    def __init__(self, config: ProxyConfig, engine: Engine | None = None):
        self.config, self._engine = config, engine
        self.server: ProxyServer | None = None
        self.url = ""
        self.client: AdminClient | None = None
        """the admin client every admin call of this proxy goes through, once started"""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="clawgym-proxy", daemon=True)

    def __enter__(self) -> "ProxyThread":
        self._thread.start()
        self.server = self.call(self._make())
        self.url = self.call(self.server.start())
        self.client = AdminClient(self.url, self.server.admin_token)
        return self

    async def _make(self) -> ProxyServer:
        return ProxyServer(self.config, self._engine)

    def call(self, coro, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def register(self, rollout_id: str | None = None, role: str = "main", script: list | None = None, max_calls: int = 0) -> dict:
        """Register through the admin HTTP route, exactly as an out-of-process runner would (proxy/client.py)."""
        return self.client.register(rollout_id, role, script, max_calls)

    def admin(self, method: str, path: str, body: dict | None = None) -> dict:
        """Call an admin route; returns the JSON answer (raises client.ProxyUnavailable on 4xx/5xx)."""
        return self.client.admin(method, path, body)

    def settle(self, rollout_id: str, timeout: float = 30.0, checks: int = 3, interval: float = 0.02) -> dict:
        """Wait until the rollout has nothing in flight and its record count held across `checks` polls (paper §3.4)."""
        return self.client.settle(rollout_id, timeout, checks, interval)

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.server is not None:
                self.call(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
