"""Sandboxes: where one rollout's harness and verifier run, behind one small Protocol.

A sandbox owns a fresh folder seeded from a task's workspace, runs commands in it (own HOME and
TMPDIR, own process group, resource limits, no network but the proxy) and, on `close()`, kills
everything it started and removes its files. Backends live in `SANDBOXES` (name -> factory):

- `local` (sandbox_local.py): a host folder; network isolation by bubblewrap or `unshare -n`
  where permitted, with a relay that carries the harness's traffic to the proxy; elsewhere an
  HTTP(S) proxy black hole that refuses outside traffic and counts it.
- `docker` (sandbox_docker.py): a container from the project's image (docker SDK).

Failures of the sandbox itself raise `SandboxError`; the rollout runner records them as
`infra_error` (paper §3.4), never as the harness's fault.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from clawgym.rollout.sandbox_base import (NETWORK_MODES, Limits, ProxyEndpoint, RunResult, Sandbox, SandboxConfig,
                                          SandboxError, default_base_dir, seed_workspace)

__all__ = ["NETWORK_MODES", "Limits", "ProxyEndpoint", "RunResult", "Sandbox", "SandboxConfig", "SandboxError",
           "SandboxFactory", "SANDBOXES", "default_base_dir", "open_sandbox", "seed_workspace"]

SandboxFactory = Callable[..., Sandbox]
"""factory(seed: Path | None, config: SandboxConfig, sandbox_id: str | None) -> Sandbox"""


def _local(seed: Path | None, config: SandboxConfig, sandbox_id: str | None = None) -> Sandbox:
    from clawgym.rollout.sandbox_local import LocalSandbox

    return LocalSandbox(seed, config, sandbox_id)


def _docker(seed: Path | None, config: SandboxConfig, sandbox_id: str | None = None) -> Sandbox:
    from clawgym.rollout.sandbox_docker import DockerSandbox

    return DockerSandbox(seed, config, sandbox_id)


SANDBOXES: dict[str, SandboxFactory] = {"local": _local, "docker": _docker}


def open_sandbox(kind: str, seed: Path | None, config: SandboxConfig | None = None, sandbox_id: str | None = None) -> Sandbox:
    """A new sandbox of backend `kind` seeded from `seed` (a task's workspace/ folder, or None)."""
    if kind not in SANDBOXES:
        from clawgym.errors import UserError

        raise UserError(f"unknown sandbox {kind!r}; choose one of: {', '.join(SANDBOXES)}")
    return SANDBOXES[kind](seed, config or SandboxConfig(), sandbox_id)
