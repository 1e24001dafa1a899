"""clawgym's own directory for what it installs and caches: `$CLAWGYM_HOME`, default `~/.cache/clawgym`.

Harness installs live in `harnesses/`, converted pretrained models in `models/`.
"""

from __future__ import annotations

import os
from pathlib import Path


def clawgym_home() -> Path:
    return Path(os.environ.get("CLAWGYM_HOME") or Path.home() / ".cache" / "clawgym")
