"""The project's Dockerfile builds on a locally made base (scripts/docker-engine.sh's image) through
scripts/docker-image.sh, which fills a wheelhouse with this host's pip so the build needs no package
index; the image runs `clawgym --help` as a non-root user and carries no wheelhouse, and runs the toy
recipe with the README's least flags for its sandbox (refusing, with those flags named, without them). A cold build
takes minutes (apt for Node, pip for torch): CI warms the engine's layer cache while it installs
(.ci/run), so here the build is mostly a cache hit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from clawgym.rollout.sandbox import CONTAINER_FLAGS, SandboxConfig
from clawgym.rollout.sandbox_docker import prepare_engine

ROOT = Path(__file__).resolve().parents[2]
DOCKER_PROBLEM = prepare_engine(SandboxConfig().image)
TAG = "clawgym:test"   # .ci/run builds the same tag


@pytest.mark.slow
@pytest.mark.skipif(DOCKER_PROBLEM is not None, reason=f"docker: {DOCKER_PROBLEM}")
def test_the_dockerfile_builds_on_a_local_base_and_runs_clawgym() -> None:
    build = subprocess.run(["scripts/docker-image.sh", TAG], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, (build.stdout[-3000:], build.stderr[-2000:])

    r = subprocess.run(["docker", "run", "--rm", "--network", "none", TAG, "clawgym", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "rollout" in r.stdout and "train" in r.stdout, r.stdout + r.stderr
    probe = ("import os, torch, clawgym; print(os.getuid() != 0, torch.__version__.endswith('+cpu'), "
             "os.path.exists('/opt/wheels'))")
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", TAG, "python3", "-c", probe],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["True", "True", "False"], r.stdout + r.stderr

    # The main job runs in the image with the README's flags, and without them says which flags it needs.
    job = ["clawgym", "run", "recipes/toy.toml", "run.steps=1"]
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", TAG, *job], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith("error: the local sandbox cannot isolate files here: "
                                                                               "bubblewrap is installed, but this container"), r.stderr
    assert CONTAINER_FLAGS in r.stderr and "install bubblewrap" not in r.stderr
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", *CONTAINER_FLAGS.split(), TAG, *job],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "step 1/1  reward" in r.stderr and "sandbox: local (bwrap)" in r.stderr, r.stdout + r.stderr[-3000:]
    readme = (ROOT / "README.md").read_text()
    assert CONTAINER_FLAGS in " ".join(readme.replace("\\\n", " ").split())  # the flags the README documents


def test_the_image_script_refuses_without_its_base(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "CLAWGYM_BASE_IMAGE": "clawgym-no-such-base:none",
           "DOCKER_HOST": f"unix://{tmp_path}/no.sock"}
    r = subprocess.run(["scripts/docker-image.sh", "clawgym:never"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    # with no docker client installed (a machine that never ran scripts/docker-engine.sh), that is the refusal
    missing = ("base image clawgym-no-such-base:none missing" if shutil.which("docker", path=env["PATH"])
               else "docker is not installed")
    assert r.returncode == 1 and r.stdout.strip() == f"[docker-image] {missing}: scripts/docker-engine.sh start", r.stdout + r.stderr
