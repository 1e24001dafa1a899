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


def _recorded_step(run: Path) -> Path:
    """A run folder with the tiny model as its model-init and one step of 3 rollouts x 2 calls, the second call
    of each delta-encoded against the first (as the proxy records them); rollout r's first call takes 2 + r s."""
    from clawgym.artifacts import CallRecord, write_table
    from clawgym.artifacts.codec import delta_encode_calls
    from clawgym.layout import RunLayout
    from clawgym.models.tiny import init_model

    layout = RunLayout(run)
    init_model(layout.model_init, seed=0, size="tiny")
    calls, t = [], 1000.0
    for r in range(3):
        first = list(range(10, 50)) + [60 + r]
        out = [70 + r, 71, 72]
        second = first + out + list(range(80, 90))
        for seq, (prompt, sampled, took) in enumerate([(first, out, 2.0 + r), (second, [73, 74], 1.0)]):
            calls.append(CallRecord(f"r{r}", f"r{r}-c{seq}", seq, "openai-chat", "m", t, t + took, prompt, sampled,
                                    [-1.0] * len(sampled), "stop", 0))
            t += 5.0
    step = layout.step(1).path
    write_table(step / "calls.parquet", delta_encode_calls(calls), CallRecord)
    (step / "rollout.config.json").write_text('{"concurrency": 2}')
    return step


@pytest.mark.slow
def test_harness_engine_replays_a_recorded_step_beside_the_runs_own_timings(tmp_path: Path) -> None:
    """`--calls-from STEP`: the step's exact prompts through the engine without and with the prefix cache (same
    samples), and a `recorded` row of the run's own latencies; a folder without calls is one line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    bench = [sys.executable, str(ROOT / "bench" / "harness_engine.py"), "--calls-from"]
    step = _recorded_step(tmp_path / "run")
    proc = subprocess.run(bench + [str(step)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "3 rollouts, 6 calls, 2 rollouts at once, 15 tokens sampled in the run" in proc.stdout
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert {"nocache", "cache", "recorded"} <= set(rows)
    assert rows["recorded"].split("|")[2].strip() == "6"  # the calls
    cells = [c.strip() for c in rows["recorded"].split("|")]
    # first calls took 2, 3 and 4 s, second calls 1 s; each rollout 5 + 1 s; the step from 1000 s to 1026 s
    assert [cells[i].split()[0] for i in (4, 6, 7, 8, 12)] == ["1.00", "3.00", "1.00", "6.0", "26.0"], cells
    assert "same ids, logprobs within 1e-4 on every call" in proc.stdout
    bad = subprocess.run(bench + [str(tmp_path / "nowhere")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().startswith("error: --calls-from") and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
