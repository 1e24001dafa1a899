"""What the hf engine's prefix cache costs on short prompts: the quickstart run with and without it.

    python3 bench/quickstart_cache.py                 # recipes/quickstart.toml twice, full length
    python3 bench/quickstart_cache.py --steps 2       # shorter: the cold start and 2 RL steps
    python3 bench/quickstart_cache.py --small         # a tiny version of both runs, correctness only

The quickstart's agentloop prompts are a few hundred tokens, where there is little to reuse and the
cache's work (hashing blocks, storing and looking up keys and values) is pure overhead. The bench
runs `clawgym run recipes/quickstart.toml` into two temporary run folders, `engine.prefix_cache=false`
(the baseline) and the default (cache on), in the order given by --order, and prints for each the
run's wall time, its rollout seconds (the `time/collect_s` of every step plus the evaluations), its
last held-out Pass@1 and the engine's share of prompt tokens computed, then the ratio cache / no
cache. Both runs sample with the same seeds, so their Pass@1 differ only where float rounding flips
a sampled token. The load average is printed before and after: run it on idle cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clawgym import artifacts as A
from clawgym.run import metrics as M

import results_md  # bench/results_md.py: --write-results

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "quickstart.toml"
MODES = {"nocache": ["engine.prefix_cache=false"], "cache": []}
SMALL = ["sft.epochs=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.every=0"]
"""--small: a short cold start, one step of 4 rollouts, no evaluation"""


def run(mode: str, out: Path, steps: int | None, extra: list[str]) -> dict[str, float]:
    """One quickstart run; its wall seconds and figures from its metrics.jsonl."""
    argv = [sys.executable, "-m", "clawgym.cli", "run", str(RECIPE), f"run.dir={out}", *MODES[mode], *extra]
    if steps is not None:
        argv.append(f"run.steps={steps}")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"error: the {mode} run failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    lines = A.read_metrics(out / "metrics.jsonl")
    rollout = sum(m.values.get(M.COLLECT.key, 0.0) + m.values.get(M.EVALUATE.key, 0.0) for m in lines)
    evals = [m.values[M.PASS_AT_1] for m in lines if M.PASS_AT_1 in m.values and m.step > 0]
    computed = [m.values[M.PROMPT_COMPUTED_SHARE] for m in lines if M.PROMPT_COMPUTED_SHARE in m.values]
    return {"wall": wall, "rollout": rollout, "pass1": evals[-1] if evals else float("nan"),
            "computed": sum(computed) / len(computed) if computed else 1.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, help="RL steps of each run (default: the recipe's)")
    ap.add_argument("--order", default="nocache,cache", help="the runs, in order (comma-separated: nocache, cache)")
    ap.add_argument("--small", action="store_true", help="one short step each, no evaluation: correctness only")
    a = results_md.parse(ap)
    if a.small:
        a.steps = 1
    order = a.order.split(",")
    if sorted(order) != sorted(MODES):
        ap.error(f"--order must name nocache and cache once each, got {a.order!r}")
    print(f"recipes/quickstart.toml{'' if a.steps is None else f' run.steps={a.steps}'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    got: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in order:
            got[mode] = run(mode, Path(tmp) / mode, a.steps, SMALL if a.small else [])
            print(f"  {mode}: {got[mode]['wall']:.0f} s", flush=True)
    base, cache = got["nocache"], got["cache"]
    print("| mode | wall s | rollout + eval s | last held-out Pass@1 | prompt computed |")
    print("|---|---|---|---|---|")
    for mode in order:
        g = got[mode]
        ratio = "" if mode == "nocache" else f" (x{g['wall'] / base['wall']:.2f})"
        rratio = "" if mode == "nocache" else f" (x{g['rollout'] / base['rollout']:.2f})"
        print(f"| {mode} | {g['wall']:.0f}{ratio} | {g['rollout']:.0f}{rratio} | {g['pass1']:.3f} | {g['computed']:.3f} |")
    print(f"cache / no cache: wall x{cache['wall'] / base['wall']:.2f}; load average after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
