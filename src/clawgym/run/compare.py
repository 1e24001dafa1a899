"""`clawgym compare`: held-out Pass@1 of several policies in several harnesses, as one table.

The paper's Table 2 reads a policy trained one way (white-box agent loop, one harness, a mix of
harnesses) in every harness it can run in. This stage makes that table from checkpoints: each
policy (a name and a model folder) is evaluated once over all the harnesses asked for, in
`OUT/<policy>/` (one proxy and engine per policy, so the harnesses share its prefix cache; a rerun
resumes the rollouts already there), then each (policy, harness) cell is scored as `clawgym eval`
scores it (docs/recipes.md): a task's score is the mean over its samples, Pass@1 the mean over
tasks.

The standard error of a cell is the standard deviation of its per-task scores over the square root
of the number of tasks. It counts both sources of noise, the tasks drawn and the samples drawn of
each, since each per-task score carries its own sampling noise; with T tasks and per-task scores
in [0, 1] it is at most 0.5 / sqrt(T). Two cells differ beyond the noise when their gap exceeds
about twice the root of their squared errors summed.

Writes `OUT/table.md` (rows policies, columns harnesses, Pass@1 ± SE in %), `OUT/table.json` and
`OUT/table.png` (grouped bars with ±1 SE).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import orjson
from rich.console import Console

from clawgym import artifacts as A, peak_memory
from clawgym.errors import UserError
from clawgym.rollout.runner import run_rollouts
from clawgym.run.eval import report_from_rollouts
from clawgym.settings import rollout_rerun

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
"""a policy's name: also its folder under OUT"""


@dataclass(frozen=True)
class Cell:
    """One policy evaluated in one harness."""

    policy: str
    harness: str
    pass1: float
    """Pass@1 as a fraction: the mean over tasks of each task's mean score"""
    se: float
    """its standard error, as a fraction (module docstring)"""
    tasks: int
    samples: int
    excluded: int
    """rollouts excluded as infra or check errors"""


def parse_policies(specs: list[str]) -> dict[str, Path]:
    """NAME=DIR pairs, in order; a one-line UserError for a bad name, a repeated name or a missing folder."""
    out: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not NAME.match(name) or not path:
            raise UserError(f"--policy {spec!r}: expected NAME=MODEL_DIR, NAME of letters, digits and ._+-")
        if name in out:
            raise UserError(f"--policy {name!r} is given twice")
        if not (Path(path) / "config.json").is_file():  # before anything loads it, or asks a hub for it
            raise UserError(f"--policy {name}: {path} is not a model directory (no config.json)")
        out[name] = Path(path)
    if not out:
        raise UserError("give at least one --policy NAME=MODEL_DIR")
    return out


def standard_error(per_task: list[float]) -> float:
    """Sample standard deviation over tasks / sqrt(tasks); 0.0 for fewer than two tasks."""
    if len(per_task) < 2:
        return 0.0
    return statistics.stdev(per_task) / math.sqrt(len(per_task))


def cells_of(policy: str, rollouts: list[A.RolloutRecord], harnesses: list[str]) -> list[Cell]:
    """One cell per harness from a policy's rollouts."""
    cells = []
    for harness in harnesses:
        report = report_from_rollouts([r for r in rollouts if r.harness == harness])
        scores = list(report.per_task.values())
        cells.append(Cell(policy, harness, report.overall, standard_error(scores), len(scores),
                          sum(report.samples.values()), report.excluded))
    return cells


def compare(policies: dict[str, Path], config, out: Path, console: Console, *, force: bool = False) -> list[Cell]:
    """Evaluate each policy in `config.harnesses` (a RolloutConfig whose model and out are replaced) and write the table.

    A policy's folder is rerun as `clawgym eval` reruns one (`settings.rollout_rerun`): the same settings
    resume, other ones (another checkpoint under the same name, another --samples-per-task) are refused unless `force`."""
    out = Path(out)
    configs = {name: replace(config, model=model, out=out / name) for name, model in policies.items()}
    for cfg in configs.values():  # every policy's folder checked before any rollout runs
        rollout_rerun(cfg, force=force, console=console, evaluation=True)
    cells: list[Cell] = []
    for i, (name, cfg) in enumerate(configs.items(), 1):
        console.print(f"compare: policy {i}/{len(policies)} {name} ({cfg.model}) in {', '.join(config.harnesses)}", markup=False)
        summary = run_rollouts(cfg, console)
        summary.check_scored()
        cells += cells_of(name, summary.rollouts, list(config.harnesses))
        peak_memory.release()  # the policy's engine is gone: its freed heap leaves before the next one loads
    write_table(cells, out)
    return cells


def markdown(cells: list[Cell]) -> str:
    policies = list(dict.fromkeys(c.policy for c in cells))
    harnesses = list(dict.fromkeys(c.harness for c in cells))
    at = {(c.policy, c.harness): c for c in cells}
    lines = ["| policy | " + " | ".join(harnesses) + " |", "|---|" + "---|" * len(harnesses)]
    for p in policies:
        row = [f"{100 * at[p, h].pass1:.1f} ± {100 * at[p, h].se:.1f}" if (p, h) in at else "-" for h in harnesses]
        lines.append(f"| {p} | " + " | ".join(row) + " |")
    tasks = sorted({c.tasks for c in cells})
    samples = sorted({c.samples for c in cells})
    excluded = sum(c.excluded for c in cells)
    note = (f"\nHeld-out Pass@1 in % ± its standard error (over tasks), by evaluation harness; "
            f"{'/'.join(map(str, tasks))} tasks, {'/'.join(map(str, samples))} scored samples a cell; "
            f"{excluded} rollout(s) excluded as infra or check errors.\n")
    return "\n".join(lines) + "\n" + note


def write_table(cells: list[Cell], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    A.atomic_write_bytes(out / "table.md", markdown(cells).encode())
    A.atomic_write_bytes(out / "table.json", orjson.dumps([asdict(c) for c in cells], option=orjson.OPT_INDENT_2))
    plot(cells, out / "table.png")


def plot(cells: list[Cell], path: Path) -> None:
    """Grouped bars: one group per evaluation harness, one bar per policy, ±1 SE whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(c.policy for c in cells))
    harnesses = list(dict.fromkeys(c.harness for c in cells))
    at = {(c.policy, c.harness): c for c in cells}
    width = 0.8 / max(len(policies), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(harnesses) + 1.5), 3.6))
    for i, p in enumerate(policies):
        xs = [j + (i - (len(policies) - 1) / 2) * width for j, h in enumerate(harnesses) if (p, h) in at]
        got = [at[p, h] for h in harnesses if (p, h) in at]
        ax.bar(xs, [100 * c.pass1 for c in got], width, yerr=[100 * c.se for c in got], capsize=3, label=p)
    ax.set_xticks(range(len(harnesses)), harnesses)
    ax.set_ylabel("held-out Pass@1 (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Pass@1 by evaluation harness (±1 SE)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
