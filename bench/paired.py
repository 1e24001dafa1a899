"""Two finished runs' held-out Pass@1, compared task by task: each run's Pass@1 at its last
evaluation, their difference, and the paired standard error of that difference over the tasks both
evaluated (the spread of the per-task differences / sqrt(tasks)). Each run's wall time is in its
own section of docs/results.md (`python3 bench/results_md.py clawgym run ...`).

A difference within two paired standard errors is what "the same learning" means when a run is
changed in a way that should not change what it learns (e.g. [run] max_staleness 0 against 1).

    python3 bench/paired.py recipes/runs/quickstart recipes/runs/quickstart-k1
    python3 bench/paired.py RUN_A RUN_B --write-results     # its section of docs/results.md
    python3 bench/paired.py --small                         # a self-check on made-up runs
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_md  # bench/results_md.py: --write-results


def last_eval(run: Path) -> tuple[str, dict[str, float]]:
    """The run's last step evaluation: its folder name and each task's mean score."""
    evals = sorted((p for p in (run / "eval").glob("step-*") if (p / "eval.json").exists()), key=lambda p: p.name)
    if not evals:
        raise SystemExit(f"{run}: no eval/step-NNNN/eval.json (a run with [eval] every > 0 writes them)")
    return evals[-1].name, json.loads((evals[-1] / "eval.json").read_text())["per_task"]


def paired(a: dict[str, float], b: dict[str, float]) -> tuple[int, float, float, float, float]:
    """(tasks both scored, Pass@1 of a, of b, mean difference b - a, its paired standard error)."""
    tasks = sorted(set(a) & set(b))
    if len(tasks) < 2:
        raise SystemExit(f"the runs share {len(tasks)} evaluated task(s); a paired error needs at least 2")
    d = [b[t] - a[t] for t in tasks]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1))
    return len(tasks), sum(a[t] for t in tasks) / len(tasks), sum(b[t] for t in tasks) / len(tasks), mean, sd / math.sqrt(len(d))


def _fake_run(root: Path, scores: dict[str, float]) -> Path:
    (root / "eval" / "step-0002").mkdir(parents=True)
    (root / "eval" / "step-0002" / "eval.json").write_text(json.dumps({"per_task": scores}))
    return root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path, help="RUN_A RUN_B")
    ap.add_argument("--small", action="store_true", help="a self-check on two made-up runs")
    a = results_md.parse(ap)
    if a.small:
        tmp = Path(tempfile.mkdtemp())
        a.runs = [_fake_run(tmp / "a", {"t1": 0.0, "t2": 1.0, "t3": 0.5}), _fake_run(tmp / "b", {"t1": 0.5, "t2": 1.0, "t3": 1.0})]
        n, pa, pb, diff, se = paired(last_eval(a.runs[0])[1], last_eval(a.runs[1])[1])
        assert (n, round(diff, 4), round(se, 4)) == (3, 0.3333, 0.1667), (n, diff, se)
    if len(a.runs) != 2:
        ap.error("give two run folders")
    (ea, sa), (eb, sb) = last_eval(a.runs[0]), last_eval(a.runs[1])
    n, pa, pb, diff, se = paired(sa, sb)
    print("| run | evaluation | held-out Pass@1 % |\n|---|---|---|")
    for run, name, p in ((a.runs[0], ea, pa), (a.runs[1], eb, pb)):
        print(f"| {run} | {name} | {100 * p:.1f} |")
    print(f"\nB - A: {100 * diff:+.1f} points, paired SE {100 * se:.1f} over {n} tasks "
          f"({'within' if abs(diff) <= 2 * se else 'outside'} two paired SEs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
