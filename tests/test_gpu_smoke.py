"""bench/gpu_smoke.sh without a GPU: its shell is valid, and its dry run (tiny sizes, segments
attention, the hf engine) takes every stage on the CPU: model, train step, engine with a weight
reload, and the mismatch table, whose rows show the engine holding the weights it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "bench" / "gpu_smoke.sh"


def test_gpu_smoke_script_is_valid_bash() -> None:
    r = subprocess.run(["bash", "-n", str(SMOKE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_gpu_smoke_dry_run_takes_every_stage_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "GPU_SMOKE_DRY": "1", "GPU_SMOKE_WORK": str(tmp_path), "GPU_SMOKE_ATTENTION": "no-such-mode",
           "GPU_SMOKE_PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(["bash", str(SMOKE)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {row["stage"]: row for row in map(json.loads, (tmp_path / "rows.jsonl").read_text().splitlines())}
    assert rows["attention"]["status"] == "fallback" and "'no-such-mode' not an option" in rows["attention"]["detail"]
    assert rows["train"]["status"] == "ok" and "512 tokens" in rows["train"]["detail"]
    assert rows["reload"]["detail"] == "policy_version 0 -> 1"
    held = [rows["mismatch: before reload vs model"], rows["mismatch: after reload vs checkpoint"]]
    assert all(row["status"] == "ok" for row in held)
    assert rows["mismatch: after reload vs model"]["status"] == "other weights"
    assert "GPU smoke (dry run on CPU)" in r.stdout and "mismatch: after reload vs checkpoint" in r.stdout
