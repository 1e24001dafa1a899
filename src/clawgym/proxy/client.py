"""The one client of the proxy's admin routes (admin.py): register, settle, read and close rollouts.

Everything that drives a proxy over HTTP uses it: the rollout runner (`rollout/proxy_client.py`
adds what the runner needs on top: records, resume), `clawgym sync`, and `ProxyThread` (a proxy in
this process, for tests and in-process runs). Settling follows the paper (§3.4): a rollout is
settled when no call of it is in flight and its record count is unchanged across several checks.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urlparse

import orjson

from clawgym.errors import UserError


class ProxyUnavailable(Exception):
    """The proxy did not answer or refused an admin call; a rollout it hits is an infra_error."""

    def __init__(self, message: str, status: int | None = None, reason: str = ""):
        super().__init__(message)
        self.status = status
        """the HTTP status of a refusal; None when the proxy did not answer"""
        self.reason = reason
        """the proxy's own error message of a refusal"""


class AdminClient:
    """Calls a proxy's admin routes at `url` with its admin token."""

    def __init__(self, url: str, admin_token: str):
        self.url, self.admin_token = url.rstrip("/"), admin_token
        parsed = urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UserError(f"proxy URL {url} must start with http:// (or https://), e.g. http://127.0.0.1:8100")
        port = parsed.port
        if port is None:
            raise UserError(f"proxy URL {url} must name a port, e.g. http://127.0.0.1:8100")
        self.port = port
        self.host = urlparse(self.url).hostname or "127.0.0.1"

    def admin(self, method: str, path: str, body: dict | None = None, timeout: float = 30.0) -> dict:
        """Call an admin route; returns its JSON answer. A refusal (4xx/5xx) or no answer raises ProxyUnavailable."""
        req = urllib.request.Request(self.url + path, method=method, data=orjson.dumps(body) if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return orjson.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode("utf-8", "replace")
            raise ProxyUnavailable(f"proxy admin {method} {path}: HTTP {e.code} {detail}", e.code, _reason(detail)) from None
        except (urllib.error.URLError, OSError) as e:
            raise ProxyUnavailable(f"proxy at {self.url} unreachable: {e}") from None

    def register(self, rollout_id: str | None = None, role: str = "main", script: list | None = None, max_calls: int = 0) -> dict:
        """A new rollout -> {"rollout_id", "base_url", "openai_base_url", "api_key"}; `script` feeds the scripted engine;
        `max_calls` > 0 bounds its model calls (the next one is refused with a 400, `call_budget`)."""
        body = ({"rollout_id": rollout_id, "role": role} | ({"script": script} if script is not None else {})
                | ({"max_calls": max_calls} if max_calls else {}))
        return self.admin("POST", "/admin/rollouts", body)

    def settle(self, rollout_id: str, timeout: float = 30.0, checks: int = 3, interval: float = 0.05) -> dict:
        """Wait until the rollout has nothing in flight and its record count held across `checks` polls."""
        from clawgym.proxy.admin import wait_settled  # here: admin brings aiohttp; the client is plain urllib

        st = wait_settled(lambda: self.admin("GET", f"/admin/rollouts/{rollout_id}"), timeout, checks, interval)
        if st is None:
            raise ProxyUnavailable(f"rollout {rollout_id} did not settle within {timeout:.0f} s")
        return st

    def conversation(self, rollout_id: str) -> list[dict]:
        """What each call of the rollout said and answered (the proxy's `conversation.py`), in arrival order."""
        return self.admin("GET", f"/admin/rollouts/{rollout_id}/conversation")["calls"]

    def close_rollout(self, rollout_id: str) -> None:
        try:
            self.admin("DELETE", f"/admin/rollouts/{rollout_id}")
        except ProxyUnavailable:
            pass  # already closed, or the proxy is gone: nothing more will be recorded either way


def _reason(detail: str) -> str:
    """The message of an admin error body ({"error": {"message": ...}}), else the body itself."""
    try:
        message = str(orjson.loads(detail)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = detail
    return " ".join(message.split())  # one line, whatever the engine's exception text held
