"""Harness adapters by name: the built-in agentloop and the real Claude Code, Codex and OpenClaw CLIs."""

from __future__ import annotations

from typing import Callable

from clawgym.rollout.harnesses.agentloop import AgentLoop
from clawgym.rollout.harnesses.base import Endpoint, Harness, Launch, Outcome
from clawgym.rollout.harnesses.claude_code import ClaudeCode
from clawgym.rollout.harnesses.codex import Codex
from clawgym.rollout.harnesses.openclaw import OpenClaw

HARNESSES: dict[str, Callable[..., Harness]] = {
    "agentloop": AgentLoop,
    "claude-code": ClaudeCode,
    "codex": Codex,
    "openclaw": OpenClaw,
}

__all__ = ["HARNESSES", "Endpoint", "Harness", "Launch", "Outcome"]
