"""The commands that prepare a run: tasks (import, make, validate) and harness (install, list)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clawgym.cli.app import app, err
from clawgym.console import console as out_console
from clawgym.errors import UserError

# --- tasks -------------------------------------------------------------------------------------

tasks_app = typer.Typer(help="Import, generate and validate task folders (instruction + workspace + verifier).", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("import")
def tasks_import(
    src: Path = typer.Argument(..., help="The foreign task set: a PinchBench checkout (or its tasks/), a folder of ClawGym task_*/, or Harbor task folders."),
    dst: Path = typer.Argument(..., help="Folder to write native task folders into (one per task)."),
    source: str = typer.Option(..., "--from", help="pinchbench | clawgym | harbor"),
    force: bool = typer.Option(False, "--force", help="Overwrite task folders that already exist in DST."),
    assets: Optional[Path] = typer.Option(None, "--assets", help="PinchBench's assets folder when it is not SRC/assets; it may lie outside SRC (links leaving SRC are refused otherwise)."),
) -> None:
    """Convert a PinchBench, ClawGym or Harbor task set into native task folders.

    Each task keeps its source's scoring rule; a task that cannot be converted is skipped with its reason.
    Two tasks with the same id: the first is imported, the second skipped with both named.

    Example: clawgym tasks import --from clawgym path/to/clawgym-bench tasks/clawgym-bench   (the format: docs/tasks.md)
    """
    from clawgym.tasks.importers import import_tasks

    with err.status(f"importing {source} tasks from {src}"):
        report = import_tasks(source, src, dst, force=force, assets=assets)
    for name, problem in report.notes:
        err.print(f"[yellow]note[/] {name}: {problem}", highlight=False, soft_wrap=True)
    for name, reason in report.skipped:
        err.print(f"[yellow]skipped[/] {name}: {reason}", highlight=False, soft_wrap=True)
    typer.echo(f"imported {len(report.imported)} task(s) into {dst}; skipped {len(report.skipped)}")
    if not report.imported:
        raise typer.Exit(1)


@tasks_app.command("make")
def tasks_make(
    family: str = typer.Argument(..., help="A generated task family (docs/tasks.md describes each; an unknown name lists them)."),
    dst: Path = typer.Argument(..., help="Folder to write the task folders into (one per task)."),
    n: int = typer.Option(..., "--count", "--n", help="How many tasks (old name: --n)."),
    seed: int = typer.Option(0, "--seed", help="The generator's seed: the same family, seed and split give the same tasks."),
    split: str = typer.Option("train", "--split", help="train | heldout: disjoint by construction (docs/tasks.md)."),
    force: bool = typer.Option(False, "--force", help="Overwrite task folders that already exist in DST."),
) -> None:
    """Generate native tasks of a family that needs tools, for training and held-out evaluation.

    Example: clawgym tasks make scan tasks/scan-train --count 96 --seed 0 --split train
    """
    from clawgym.tasks.families import make_tasks

    made = make_tasks(family, dst, n=n, seed=seed, split=split, force=force)
    typer.echo(f"made {len(made)} {family} task(s) ({split}, seed {seed}) in {dst}")


@tasks_app.command("validate")
def tasks_validate(
    path: Path = typer.Argument(..., help="A task folder or a folder of task folders."),
    jobs: int = typer.Option(2, "--jobs", "-j", help="Tasks checked at once."),
    sandbox: str = typer.Option("local", help="Sandbox backend: local (bubblewrap) | docker | docker:IMAGE | local-unisolated (no file isolation)."),
    network: str = typer.Option("auto", help="Local sandbox network: auto | bwrap | unshare | blackhole (the last two with local-unisolated)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report as JSON."),
    all_rows: bool = typer.Option(False, "--all", help="List every task, not only those with a problem or a positive no-op score."),
) -> None:
    """Parse every task, run its verifier on the untouched workspace, and report no-op scores and flags.

    Flags say what a task needs beyond files and python3 (network, browser, judge, binary inputs, ...).
    Exits 1 when a task folder is invalid or its checks crash on the untouched workspace (check_error).

    Example: clawgym tasks validate tasks/clawgym-bench --jobs 2
    """
    from clawgym.artifacts import atomic_write_bytes
    from clawgym.rollout.sandbox import SandboxConfig, isolation
    from clawgym.rollout.validate import print_report, validate_tasks

    # the verifiers run task code: the same isolation rule as a rollout (refused in one line without it); no
    # sandbox line, which is about where an agent's commands run
    isolation(sandbox, network)
    with err.status(f"validating tasks in {path}"):
        report = validate_tasks(path, sandbox=sandbox, sandbox_config=SandboxConfig(network=network), jobs=jobs)
    print_report(report, out_console(), show_all=all_rows)
    if json_out:
        atomic_write_bytes(json_out, report.to_json())
    crashed = sum(t.status == "check_error" for t in report.tasks)
    if report.n_invalid or crashed:  # a check that crashes on the untouched workspace would score every rollout 0
        err.print(f"error: {report.n_invalid} task(s) invalid, {crashed} whose checks crash on the untouched workspace "
                  f"(check_error: each would score every rollout 0); the status column above says which", highlight=False)
        raise typer.Exit(1)


# --- harnesses ---------------------------------------------------------------------------------

harness_app = typer.Typer(help="Install and list the agent harnesses rollouts can drive.", no_args_is_help=True)
app.add_typer(harness_app, name="harness")


@harness_app.command("install")
def harness_install(name: str = typer.Argument(..., metavar="NAME", help="claude-code | codex | openclaw.")) -> None:
    """Install a harness's pinned npm version into clawgym's own prefix ($CLAWGYM_HOME/harnesses).

    Example: clawgym harness install claude-code
    """
    from clawgym.rollout.harnesses import HARNESSES

    if name not in HARNESSES:
        raise UserError(f"unknown harness '{name}'; choose one of: {', '.join(HARNESSES)}")
    harness = HARNESSES[name]()
    if not hasattr(harness, "install"):
        typer.echo(f"{name} is built in; nothing to install")
        return
    with err.status(f"installing {name} with npm"):
        path = harness.install()
    typer.echo(f"installed {name}: {path}")


@harness_app.command("list")
def harness_list() -> None:
    """List the harnesses, the protocol each speaks, and whether it can run here.

    Example: clawgym harness list
    """
    from rich.table import Table

    from clawgym.rollout.harnesses import HARNESSES

    table = Table("harness", "protocol", "status")
    for name, make in HARNESSES.items():
        h = make()
        table.add_row(name, h.protocol, h.missing() or "ready")
    out_console().print(table)


