"""The serving proxy: Anthropic Messages, OpenAI Chat Completions and Responses in front of an engine,
with exact token capture, incremental rendering and per-rollout attribution (docs/architecture.md, docs/engines.md).

Entry points: `ProxyConfig` + `ProxyServer` (an aiohttp app), `ProxyThread` (the same on a
background thread, for tests and in-process runners), `serve` (the CLI's blocking server), and
`export_calls` (records -> calls.parquet).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from clawgym.errors import UserError

if TYPE_CHECKING:
    from clawgym.proxy.config import ProxyConfig

__all__ = ["ProxyConfig", "ProxyServer", "ProxyThread", "export_calls", "read_records", "serve"]

_LOADED_WHEN_USED = {"ProxyConfig": "clawgym.proxy.config", "ProxyServer": "clawgym.proxy.server", "ProxyThread": "clawgym.proxy.thread",
                     "export_calls": "clawgym.proxy.recorder", "read_records": "clawgym.proxy.recorder"}


def __getattr__(name: str):
    """The server and recorder (aiohttp, pyarrow) are imported when first asked for, so the command
    line, which builds serve-proxy's options from `ProxyConfig`, starts without them; the config too,
    so that rollout.config, which ProxyConfig's fields copy, can read the tool parsers' names here."""
    if name in _LOADED_WHEN_USED:
        return getattr(importlib.import_module(_LOADED_WHEN_USED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def serve(config: ProxyConfig, *, ready=None) -> int | None:
    """Run the proxy until SIGINT or SIGTERM; `ready(url, server)` is called once it listens.
    Returns the signal that stopped it.

    Both signals stop it the same way: no new connections, running calls finish and are recorded.
    They are handled explicitly because a proxy started in the background (`nohup ... &`, a
    container) may have inherited SIGINT as ignored, and is usually stopped with SIGTERM.
    """
    import asyncio
    import signal

    from clawgym.proxy.server import ProxyServer  # here: the server brings aiohttp, which `clawgym --help` need not load

    stopped_by: list[int] = []

    async def main() -> None:
        server = ProxyServer(config)
        try:
            url = await server.start()
        except OSError as e:  # the port is taken (by vLLM, a judge, another proxy) or not ours to bind
            await server.stop()
            raise UserError(f"cannot listen on {config.host}:{config.port}: {e.strerror or e}; pick another --port "
                            f"(--port 0 takes a free one)") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, lambda s=sig: (stopped_by.append(s), stop.set()))
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signals
                pass
        if ready is not None:
            ready(url, server)
        try:
            await stop.wait()
        finally:
            await server.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        stopped_by.append(signal.SIGINT)
    return stopped_by[0] if stopped_by else None
