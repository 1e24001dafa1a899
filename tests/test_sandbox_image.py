"""The project's Dockerfile builds against a locally made base (scripts/docker-engine.sh's image,
named by the BASE build argument) and the image runs `clawgym --help`. Heavy: the build installs
torch and the toolkit from the package index (minutes), and needs HTTPS to it from inside the
build (a machine whose HTTPS goes through an intercepting proxy must give the build its CA); run
with `pytest -m heavy` where an engine runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clawgym.rollout.sandbox import SandboxConfig
from clawgym.rollout.sandbox_docker import prepare_engine

ROOT = Path(__file__).resolve().parents[1]
DOCKER_PROBLEM = prepare_engine(SandboxConfig().image)


@pytest.mark.heavy
@pytest.mark.skipif(DOCKER_PROBLEM is not None, reason=f"docker: {DOCKER_PROBLEM}")
def test_the_dockerfile_builds_on_a_local_base_and_runs_clawgym() -> None:
    tag = "clawgym-test-image:latest"
    build = subprocess.run(["docker", "build", "--network", "host", "--build-arg", f"BASE={SandboxConfig().image}", "-t", tag, "."],
                           cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, (build.stdout[-3000:], build.stderr[-2000:])
    try:
        r = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, "clawgym", "--help"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "rollout" in r.stdout, r.stdout + r.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
