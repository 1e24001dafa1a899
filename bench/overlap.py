"""What overlapping rollouts with training saves: the same `clawgym run` with [run] max_staleness = 0
(collect, then train, each step in turn) and = 1 (step k+1's rollouts while step k trains).

The rollouts are latency-bound, as a harness sees a GPU server: the scripted engine answers every
call after a fixed delay (`delay_s`), on the toy tasks through the agentloop harness, while the
trainer trains the small model with PPO on the CPU. The delay is calibrated first so that a
step's rollouts take about as long as its training (synchronous steps without delay measure both,
the first, which loads the models, left out), which is where overlapping pays most: the ideal ratio is then 1/2.

    python3 bench/overlap.py --json              # one JSON object: sync_s, async_s, ratio, ...
    python3 bench/overlap.py --write-results     # and its section of docs/results.md
    python3 bench/overlap.py --small             # a smoke run in seconds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_md  # bench/results_md.py: --write-results

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "tasks" / "toy"


def recipe(scratch: Path, name: str, steps: int, staleness: int, delay_s: float, tasks: int, group: int) -> Path:
    """A toy recipe whose scripted engine answers every call after `delay_s` seconds."""
    tasks_dir = scratch / "tasks"
    if not tasks_dir.exists():
        tasks_dir.mkdir()
        for d in sorted(TOY.iterdir())[:tasks]:
            shutil.copytree(d, tasks_dir / d.name)
    script = scratch / f"{name}.jsonl"
    answers = [str(i % 7) for i in range(steps * tasks * group * 2 + 8)]  # numbers, some right: rewards vary
    script.write_text("".join(json.dumps({"rollout_id": "*", "text": a, "delay_s": delay_s}) + "\n" for a in answers))
    path = scratch / f"{name}.toml"
    path.write_text(f"""
[run]
name = "{name}"
steps = {steps}
max_staleness = {staleness}

[model]
init = "small"

[engine]
name = "scripted"
script = "{script}"

[rollout]
tasks = "{tasks_dir}"
harnesses = ["agentloop"]
group_size = {group}
concurrency = {tasks * group}

[rollout.agentloop]
max_turns = 1

[train]
algo = "ppo"
epochs = 8
""")
    return path


def timed_run(path: Path) -> tuple[float, list[dict[str, float]]]:
    from clawgym.run.loop import run

    t = time.monotonic()
    lines = run(path)
    return time.monotonic() - t, [m.values for m in lines]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=2, help="toy tasks a step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--delay", type=float, default=None, help="seconds each call waits (default: calibrated)")
    ap.add_argument("--json", action="store_true", help="print only the JSON object on stdout")
    ap.add_argument("--small", action="store_true", help="a smoke run in seconds: 2 steps, no calibration")
    a = results_md.parse(ap)
    if a.small:
        a.steps, a.delay, a.group_size = 2, 0.5, 2
    from clawgym.run.metrics import COLLECT, OPTIMIZE

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        os.chdir(scratch)
        if a.delay is None:  # synchronous steps without delay: how long a warm step's rollouts and training take
            _, probe = timed_run(recipe(scratch, "probe", 3, 0, 0.0, a.tasks, a.group_size))
            a.delay = max(0.0, mean([v[OPTIMIZE.key] - v[COLLECT.key] for v in probe[1:]]))
        sync_s, sync = timed_run(recipe(scratch, "sync", a.steps, 0, a.delay, a.tasks, a.group_size))
        async_s, overlapped = timed_run(recipe(scratch, "async", a.steps, 1, a.delay, a.tasks, a.group_size))
    result = {"sync_s": round(sync_s, 2), "async_s": round(async_s, 2), "ratio": round(async_s / sync_s, 3),
              "steps": a.steps, "delay_s": round(a.delay, 3), "rollouts_per_step": a.tasks * a.group_size,
              "sync_collect_s_mean": round(mean([v[COLLECT.key] for v in sync]), 2),
              "sync_train_s_mean": round(mean([v[OPTIMIZE.key] for v in sync]), 2),
              "async_stale_groups": sum(v.get("rollout/stale_groups", 0.0) for v in overlapped)}
    if not a.json:
        print(f"`clawgym run` of {a.steps} steps, {a.tasks * a.group_size} agentloop rollouts a step on the toy tasks "
              f"(scripted engine, {a.delay:.2f} s a call), PPO on the small model, {os.cpu_count()} CPUs: "
              f"max_staleness 0 against 1")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
