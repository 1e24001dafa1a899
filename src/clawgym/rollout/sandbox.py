"""Sandboxes: where one rollout's harness and verifier run, behind one small Protocol.

A sandbox owns a fresh folder seeded from a task's workspace, runs commands in it (own HOME and
TMPDIR, own process group, resource limits, no network but the proxy) and, on `close()`, kills
everything it started and removes its files. Backends live in `SANDBOXES` (name -> factory):

- `local` (sandbox_local.py): a host folder; network isolation by bubblewrap or `unshare -n`
  where permitted, with a relay that carries the harness's traffic to the proxy; elsewhere an
  HTTP(S) proxy black hole that refuses outside traffic and counts it.
- `docker` (sandbox_docker.py): a container (docker SDK); `docker:IMAGE` names its image.

A rollout run asks `isolation()` once before it starts: `local` must get bubblewrap (file
isolation) or the run is refused in one line naming the fix; `local-unisolated` is the explicit
opt-in to run agent commands where they see the host's files (docs/harnesses.md, "Sandboxes").

Failures of the sandbox itself raise `SandboxError`; the rollout runner records them as
`infra_error` (paper §3.4), never as the harness's fault.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from clawgym.errors import UserError
from clawgym.rollout.sandbox_base import (NETWORK_MODES, Limits, ProxyEndpoint, RunResult, Sandbox, SandboxConfig, SandboxError,
                                          default_base_dir, seed_workspace)
from clawgym.rollout.sandbox_docker import DockerSandbox, prepare_engine
from clawgym.rollout.sandbox_local import LocalSandbox, namespace_problem, resolve_network

__all__ = ["NETWORK_MODES", "Isolation", "Limits", "ProxyEndpoint", "RunResult", "Sandbox", "SandboxConfig", "SandboxError",
           "SandboxFactory", "SANDBOXES", "announce", "default_base_dir", "isolation", "open_sandbox", "seed_workspace"]

SandboxFactory = Callable[..., Sandbox]
"""factory(seed: Path | None, config: SandboxConfig, sandbox_id: str | None) -> Sandbox"""


def _local(seed: Path | None, config: SandboxConfig, sandbox_id: str | None = None) -> Sandbox:
    return LocalSandbox(seed, config, sandbox_id)


def _docker(seed: Path | None, config: SandboxConfig, sandbox_id: str | None = None) -> Sandbox:
    return DockerSandbox(seed, config, sandbox_id)


SANDBOXES: dict[str, SandboxFactory] = {"local": _local, "local-unisolated": _local, "docker": _docker}


def parse_kind(kind: str) -> tuple[str, str | None]:
    """`docker:IMAGE` -> ("docker", IMAGE); any other name -> (name, None); an unknown name is a UserError."""
    backend, colon, image = kind.partition(":")
    if backend not in SANDBOXES or (colon and (backend != "docker" or not image)):
        raise UserError(f"unknown sandbox {kind!r}; choose one of: {', '.join(SANDBOXES)}, docker:IMAGE")
    return backend, image or None


def open_sandbox(kind: str, seed: Path | None, config: SandboxConfig | None = None, sandbox_id: str | None = None) -> Sandbox:
    """A new sandbox of backend `kind` (or `docker:IMAGE`) seeded from `seed` (a task's workspace/ folder, or None)."""
    backend, image = parse_kind(kind)
    config = config or SandboxConfig()
    if image is not None:
        config = dataclasses.replace(config, image=image)
    return SANDBOXES[backend](seed, config, sandbox_id)


@dataclass(frozen=True)
class Isolation:
    """What a run's sandboxes isolate, decided once before the run; recorded in rollout.config.json."""

    sandbox: str
    """the backend: local | local-unisolated | docker"""
    network: str
    """the network mode in effect: bwrap | unshare | blackhole | host (local), none (docker)"""
    files: bool
    """whether agent commands are kept from the host's files (read-only /, other sandboxes hidden)"""
    image: str | None
    """the docker image"""
    summary: str

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_WHAT = {
    "bwrap": (True, "files (host / read-only, other sandboxes and the task set hidden, workspace at {workdir}), "
                    "network (the proxy only), processes (own pid namespace)"),
    "unshare": (False, "network only (the proxy only); NOT files: agent commands see and can write this machine's files"),
    "blackhole": (False, "nothing enforced: agent commands see and can write this machine's files, and only clients "
                         "that honour HTTP(S)_PROXY are kept off the network"),
    "host": (False, "nothing: agent commands see this machine's files and network"),
}


def isolation(kind: str, network: str = "auto", workdir: str = "/workspace") -> Isolation:
    """What sandbox `kind` with network mode `network` isolates here, or a UserError in one line naming the fix.

    `local` insists on file isolation (bubblewrap): without it, agent commands would run as this
    user among this machine's files, and the sandbox's random host folder would appear in every
    prompt, so rollouts of one task would no longer share their first prompt."""
    backend, image = parse_kind(kind)
    if backend == "docker":
        image = image or SandboxConfig().image
        if (problem := prepare_engine(image)) is not None:
            raise UserError(f"--sandbox docker: {problem}")
        return Isolation("docker", "none", True, image, f"docker (image {image}): files (own container, workspace at "
                                                         f"{workdir}), network (the proxy only), processes, memory/CPU/pids limits")

    if network not in NETWORK_MODES:
        raise UserError(f"sandbox network mode {network!r}; allowed: {', '.join(NETWORK_MODES)}")
    if backend == "local" and network not in ("auto", "bwrap"):
        raise UserError(f"--network {network} gives agent commands this machine's files; to accept that, choose "
                        f"--sandbox local-unisolated (recipe: sandbox = \"local-unisolated\"), else drop --network")
    if backend == "local" and (problem := namespace_problem("bwrap")) is not None:
        raise UserError(isolation_refusal(problem))
    try:
        mode = resolve_network(network)
    except SandboxError as e:
        raise UserError(str(e)) from None
    files, what = _WHAT[mode]
    return Isolation(backend, mode, files, None, f"{backend} ({mode}): {what.format(workdir=workdir)}")



_announced: set[str] = set()


def announce(iso: Isolation, console: Any) -> None:
    """Print what the sandboxes isolate on `console` (a rich Console), once per process: a run's
    steps and evaluations share one line."""
    if iso.summary not in _announced:
        _announced.add(iso.summary)
        console.print(f"sandbox: {iso.summary}", markup=False, highlight=False)


CONTAINER_FLAGS = "--security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined"
"""the least a `docker run` needs for bubblewrap inside it (README, "Docker"; tests/rollout/test_sandbox_image.py)"""


def in_container() -> bool:
    """Whether this process runs in a Docker or Podman container (their marker files)."""
    return Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()


def isolation_refusal(problem: str) -> str:
    """The one line for a local sandbox that bubblewrap cannot isolate: the cause, and what fixes it."""
    if shutil.which("bwrap") is not None and in_container():
        return (f"the local sandbox cannot isolate files here: bubblewrap is installed, but this container does not let "
                f"it make namespaces ({problem}). Start the container with {CONTAINER_FLAGS} (README, \"Docker\"; "
                f"--privileged also works but grants far more), or accept running agent commands among the "
                f"container's files with --sandbox local-unisolated")
    return (f"the local sandbox cannot isolate files here ({problem}): install bubblewrap (apt-get install "
            f"bubblewrap, or scripts/install.sh as root), or use --sandbox docker, or accept running agent "
            f"commands among this machine's files with --sandbox local-unisolated")
