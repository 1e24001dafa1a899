"""Admin routes (admin token required) and the proxy's Prometheus metrics.

    POST   /admin/rollouts                 {"rollout_id"?, "role"?, "script"?: [...]} -> base URLs + API key
    GET    /admin/rollouts/{id}            status for settling: calls recorded, in flight, last activity,
                                           the last answered call's status and error, and whether the
                                           last request was refused as too long for the context window
    GET    /admin/rollouts/{id}/conversation  each call's new messages and parsed answer (`conversation.py`)
    DELETE /admin/rollouts/{id}            forget a finished rollout's render state, close its file
    POST   /admin/rollouts/{id}/script     {"items": [...]} queue model texts (scripted engine)
    POST   /admin/reload                   {"checkpoint": DIR} -> new policy_version
    GET    /admin/health                   engine, policy version, tool parser, rollouts, in flight
    GET    /admin/metrics                  Prometheus text format (with the engine's own numbers as
                                           clawgym_engine_* gauges when it reports any)
    GET    /admin/engine                   {"stats": the engine's own numbers} ({} for an engine without any):
                                           the run loop reads the prefix cache's counters per step
    DELETE /admin/engine/cache             drop the engine's cached keys/values (`DropsCache`) -> freed_bytes;
                                           the run loop calls it before training in its own process

The admin token travels as `Authorization: Bearer …` or `x-admin-token`. A rollout's API key is
returned once, at registration, and never logged or recorded. Secrets are compared as the bytes
the client sent (`secret_matches`), so a header that is not UTF-8 is a wrong key (401), not a 500.
"""

from __future__ import annotations

import hmac
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import orjson
from aiohttp import web

from clawgym.engines.base import DropsCache, ReportsStats
from clawgym.errors import UserError
from clawgym.proxy.types import ProtocolError


def secret_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a header value with a key or token. aiohttp hands over header
    bytes that are not UTF-8 as surrogate escapes; they are compared as the bytes that were sent."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())


class Metrics:
    """Counters, gauges and summaries with labels, rendered in the Prometheus text format."""

    def __init__(self) -> None:
        self.counters: dict[tuple, float] = defaultdict(float)
        self.gauges: dict[tuple, float] = defaultdict(float)
        self.sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    @staticmethod
    def _key(name: str, labels: dict[str, str]) -> tuple:
        return (name, tuple(sorted(labels.items())))

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        self.counters[self._key(name, labels)] += value

    def gauge_add(self, name: str, value: float, **labels: str) -> None:
        self.gauges[self._key(name, labels)] += value

    def gauge_set(self, name: str, value: float, **labels: str) -> None:
        self.gauges[self._key(name, labels)] = value

    def observe(self, name: str, value: float) -> None:
        s = self.sums[name]
        s[0] += value
        s[1] += 1

    def get(self, name: str, **labels: str) -> float:
        k = self._key(name, labels)
        return self.counters.get(k, self.gauges.get(k, 0.0))

    def text(self) -> str:
        lines: list[str] = []
        for kind, table in (("counter", self.counters), ("gauge", self.gauges)):
            seen = set()
            for (name, labels), v in sorted(table.items()):
                if name not in seen:
                    lines.append(f"# TYPE {name} {kind}")
                    seen.add(name)
                lab = ",".join(f'{k}="{val}"' for k, val in labels)
                lines.append(f"{name}{{{lab}}} {v:g}" if lab else f"{name} {v:g}")
        for name, (total, count) in sorted(self.sums.items()):
            lines += [f"# TYPE {name} summary", f"{name}_sum {total:g}", f"{name}_count {count:g}"]
        return "\n".join(lines) + "\n"


SCRIPT_ITEMS = "must be a list of texts or {text|error, delay_s} objects"


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _err(status: int, message: str) -> web.Response:
    return _json({"error": {"message": message}}, status)


class AdminRoutes:
    """The admin routes' handlers over one ProxyServer: rollouts (register, status, conversation,
    close, script), the engine (reload, stats, drop its cache), health and Prometheus metrics."""

    def __init__(self, server: Any):
        self.server = server

    def authed(self, handler):
        async def wrapped(request: web.Request) -> web.Response:
            auth = request.headers.get("Authorization", "")
            token = request.headers.get("x-admin-token") or (auth[7:].strip() if auth[:7].lower() == "bearer " else "")
            if not secret_matches(token, self.server.admin_token):
                return _err(401, "admin token missing or wrong (send Authorization: Bearer <admin token>)")
            try:
                return await handler(request)
            except UserError as e:
                return _err(400, str(e))
            except ProtocolError as e:
                return _err(409 if e.kind == "conflict" else 400, e.message)
        return wrapped

    @staticmethod
    async def body(request: web.Request) -> dict:
        if not request.can_read_body:
            return {}
        try:
            data = orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            raise UserError(f"request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise UserError("request body must be a JSON object")
        return data

    def status(self, r) -> dict:
        return {"rollout_id": r.id, "role": r.role, "calls_recorded": self.server.recorder.count(r.id), "calls_started": r.seq,
                "in_flight": r.in_flight, "errors": r.errors, "last_activity": r.last_activity,
                "idle_s": round(time.time() - r.last_activity, 3), "policy_version": self.server.engine.policy_version,
                "last_call_status": r.last_call[1], "last_call_error": r.last_call[2],
                # the last thing the rollout asked for did not fit the window: no call started after it
                "context_exceeded": r.context_refused[1] if r.context_refused[0] == r.seq else "",
                # it asked for a call past its budget: the harness ended on that refusal
                "call_budget_spent": r.budget_refused}

    async def register(self, request: web.Request) -> web.Response:
        data = await self.body(request)
        role = data.get("role") or "main"
        if role not in ("main", "subagent", "compaction", "aux"):
            raise UserError(f"role must be main, subagent, compaction or aux, got {role!r}")
        script = data.get("script")
        if script is not None and not hasattr(self.server.engine, "push"):
            raise UserError(f"'script' needs the scripted engine; this proxy runs '{self.server.config.engine}'")
        if script is not None and not isinstance(script, list):
            raise UserError(f"'script' {SCRIPT_ITEMS}")
        max_calls = data.get("max_calls", 0)
        if not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 0:
            raise UserError(f"max_calls must be an integer >= 0 (0: no bound), got {max_calls!r}")
        r = self.server.register(data.get("rollout_id"), role, max_calls=max_calls)
        if script is not None:
            self.server.engine.push(r.id, script)
        base = f"http://{request.host}/r/{r.id}"
        return _json({"rollout_id": r.id, "base_url": base, "openai_base_url": base + "/v1", "api_key": r.api_key}, 201)

    async def get_status(self, request: web.Request) -> web.Response:
        r = self.server.rollouts.get(request.match_info["id"])
        return _err(404, f"unknown rollout '{request.match_info['id']}'") if r is None else _json(self.status(r))

    async def conversation(self, request: web.Request) -> web.Response:
        r = self.server.rollouts.get(request.match_info["id"])
        if r is None:
            return _err(404, f"unknown rollout '{request.match_info['id']}'")
        return _json({"rollout_id": r.id, "calls": r.conversation.to_json()})

    async def close(self, request: web.Request) -> web.Response:
        r = self.server.rollouts.pop(request.match_info["id"], None)
        if r is None:
            return _err(404, f"unknown rollout '{request.match_info['id']}'")
        self.server.recorder.close_rollout(r.id)
        return _json(self.status(r) | {"closed": True})

    async def push_script(self, request: web.Request) -> web.Response:
        rid = request.match_info["id"]
        if rid not in self.server.rollouts:
            return _err(404, f"unknown rollout '{rid}'")
        if not hasattr(self.server.engine, "push"):
            raise UserError(f"scripts need the scripted engine; this proxy runs '{self.server.config.engine}'")
        items = (await self.body(request)).get("items")
        if not isinstance(items, list):
            raise UserError(f"'items' {SCRIPT_ITEMS}")
        return _json({"rollout_id": rid, "queued": self.server.engine.push(rid, items)})

    async def reload(self, request: web.Request) -> web.Response:
        ckpt = (await self.body(request)).get("checkpoint")
        if not isinstance(ckpt, str) or not ckpt:
            raise UserError("'checkpoint' (a directory) is required")
        if not Path(ckpt).is_dir():
            raise UserError(f"checkpoint {ckpt} is not a directory")
        version = await self.server.engine.reload(Path(ckpt))
        self.server.metrics.gauge_set("clawgym_proxy_policy_version", version)
        return _json({"policy_version": version})

    async def health(self, request: web.Request) -> web.Response:
        return _json({"status": "ok", "engine": self.server.config.engine, "model": self.server.model_name,
                      "model_dir": str(Path(self.server.config.model_dir).resolve()),
                      "policy_version": self.server.engine.policy_version, "max_context": self.server.engine.max_context,
                      "tool_parser": self.server.tool_parser, "tool_parser_source": self.server.tool_parser_source,
                      "rollouts": len(self.server.rollouts), "in_flight": sum(r.in_flight for r in self.server.rollouts.values())})

    async def metrics(self, request: web.Request) -> web.Response:
        self.server.metrics.gauge_set("clawgym_proxy_policy_version", self.server.engine.policy_version)
        self.server.metrics.gauge_set("clawgym_proxy_rollouts", len(self.server.rollouts))
        self.server.metrics.gauge_set("clawgym_proxy_record_bytes", self.server.recorder.bytes_written)
        if isinstance(self.server.engine, ReportsStats):  # e.g. the hf engine's prefix cache (docs/engines.md)
            for name, value in self.server.engine.stats().items():
                self.server.metrics.gauge_set(f"clawgym_engine_{name}", value)
        return web.Response(text=self.server.metrics.text(), content_type="text/plain", charset="utf-8")

    async def drop_engine_cache(self, request: web.Request) -> web.Response:
        if not isinstance(self.server.engine, DropsCache):
            return _json({"dropped": False, "freed_bytes": 0})
        return _json({"dropped": True, "freed_bytes": await self.server.engine.drop_cache()})

    async def engine_stats(self, request: web.Request) -> web.Response:
        return _json({"stats": self.server.engine.stats() if isinstance(self.server.engine, ReportsStats) else {}})


def add_admin_routes(app: web.Application, server: Any) -> None:
    """Attach the admin routes of `server` (a ProxyServer) to `app`, each behind the admin token."""
    routes, r = AdminRoutes(server), app.router
    r.add_post("/admin/rollouts", routes.authed(routes.register))
    r.add_get("/admin/rollouts/{id}", routes.authed(routes.get_status))
    r.add_get("/admin/rollouts/{id}/conversation", routes.authed(routes.conversation))
    r.add_delete("/admin/rollouts/{id}", routes.authed(routes.close))
    r.add_post("/admin/rollouts/{id}/script", routes.authed(routes.push_script))
    r.add_post("/admin/reload", routes.authed(routes.reload))
    r.add_get("/admin/health", routes.authed(routes.health))
    r.add_get("/admin/metrics", routes.authed(routes.metrics))
    r.add_get("/admin/engine", routes.authed(routes.engine_stats))
    r.add_delete("/admin/engine/cache", routes.authed(routes.drop_engine_cache))


def wait_settled(status: Callable[[], dict], timeout: float = 30.0, checks: int = 3, interval: float = 0.05) -> dict | None:
    """Poll a rollout's admin status until nothing is in flight and its record count held across
    `checks` polls (paper §3.4); the settled status, or None when `timeout` seconds passed first."""
    deadline, last, same = time.monotonic() + timeout, None, 0
    while time.monotonic() < deadline:
        st = status()
        key = (st["calls_recorded"], st["calls_started"])
        same = same + 1 if st["in_flight"] == 0 and key == last else 0
        if same >= checks:
            return st
        last = key
        time.sleep(interval)
    return None
