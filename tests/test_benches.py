"""Every benchmark in bench/ still runs: each `bench/*.py --small` (a tiny correctness-only version)
exits 0. No timing is asserted; the benches compare speed against their own baselines when run in full."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted((ROOT / "bench").glob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("bench", BENCHES, ids=[b.stem for b in BENCHES])
def test_bench_small_mode_runs(bench: Path, tmp_path: Path) -> None:
    assert "--small" in bench.read_text(encoding="utf-8"), f"{bench.relative_to(ROOT)} has no --small mode"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(bench), "--small"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])

