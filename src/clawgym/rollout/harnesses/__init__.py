"""Harness adapters by name: the built-in agentloop and the real Claude Code, Codex and OpenClaw CLIs.

`HARNESSES` is built on first use: the agentloop's own process (`python -m
clawgym.rollout.harnesses.agentloop`, one per rollout) imports this package too, and must not pay
for the other adapters' imports (pyarrow among them) on every start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

from clawgym.rollout.harnesses.base import Endpoint, Harness, Launch, Outcome

if TYPE_CHECKING:
    HARNESSES: dict[str, Callable[..., Harness]]


# Name -> (module, class) of each adapter.
ADAPTERS = {"agentloop": ("agentloop", "AgentLoop"), "claude-code": ("claude_code", "ClaudeCode"),
            "codex": ("codex", "Codex"), "openclaw": ("openclaw", "OpenClaw")}


def _adapters() -> dict[str, Callable[..., Harness]]:
    return {name: getattr(importlib.import_module(f"{__name__}.{module}"), cls) for name, (module, cls) in ADAPTERS.items()}


def __getattr__(name: str) -> Any:
    if name == "HARNESSES":
        value = _adapters()
        globals()["HARNESSES"] = value  # later lookups find the module attribute directly
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["HARNESSES", "Endpoint", "Harness", "Launch", "Outcome"]
