"""The `clawgym` command line: a table of contents of the pipeline, one short function per command.

Each command only parses its arguments and calls the stage that does the work; stages exchange
files on disk (see `artifacts.py`). Errors a user can cause surface as one line on stderr: exit 2
for usage errors (Typer's own), exit 1 for runtime errors (`UserError`, `ArtifactError`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from clawgym import __version__
from clawgym.errors import UserError

app = typer.Typer(
    name="clawgym",
    help="Train LLM agents with RL through the agent harnesses people deploy (ClawGym II).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"clawgym {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Train LLM agents with RL through the agent harnesses people deploy (ClawGym II).

    Stages exchange files on disk; each runs alone and can be inspected:
    init-model → serve-proxy → rollout → build-trees → train → eval.
    """


# --- models ------------------------------------------------------------------------------------


@app.command("init-model")
def init_model(
    out: Path = typer.Argument(..., metavar="DIR", help="Directory to write the model to (created; must be empty or absent)."),
    seed: int = typer.Option(0, help="Seed for the tokenizer corpus order and the weights."),
    size: str = typer.Option("tiny", help="tiny (0.65M parameters, 2 layers) or small (3.6M, 4 layers)."),
    force: bool = typer.Option(False, "--force", help="Overwrite a non-empty directory."),
) -> None:
    """Write a random-weight Qwen3-architecture model with a tool-calling chat template.

    Deterministic: the same seed and size give byte-identical files.

    Example: clawgym init-model models/tiny --seed 0
    """
    from clawgym.model import init_model as _init

    with err.status(f"building {size} model in {out}"):
        info = _init(out, seed=seed, size=size, force=force)
    typer.echo(f"wrote {info.path}: {info.architecture}, {info.n_params:,} parameters, vocab {info.vocab_size}")


# --- reconstruct -------------------------------------------------------------------------------


@app.command("build-trees")
def build_trees(
    step_dir: Optional[Path] = typer.Argument(None, help="A step directory: reads calls.parquet and rollouts.parquet there, writes trees.parquet."),
    calls: Optional[Path] = typer.Option(None, help="calls.parquet (overrides STEP_DIR's)."),
    rollouts: Optional[Path] = typer.Option(None, help="rollouts.parquet (overrides STEP_DIR's)."),
    out: Optional[Path] = typer.Option(None, help="trees.parquet to write (overrides STEP_DIR's)."),
    max_leaves: int = typer.Option(64, min=1, help="Drop a rollout whose tree has more leaves than this (over-branching)."),
    metrics: Optional[Path] = typer.Option(None, help="metrics.jsonl to append the trees/ line to (default for a step-NNNN dir: the run's)."),
    step: Optional[int] = typer.Option(None, help="Step number of the metrics line (default: from STEP_DIR's name or the rollouts)."),
) -> None:
    """Rebuild each rollout's calls into one prefix tree over token ids, filter it, and report.

    Example: clawgym build-trees --calls calls.parquet --rollouts rollouts.parquet --out trees.parquet

    Example: clawgym build-trees runs/demo/step-0001
    """
    from clawgym.trees import resolve_config, run_build_trees

    run_build_trees(resolve_config(step_dir, calls, rollouts, out, max_leaves, metrics, step), Console())


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
    Console().print(table)


# --- tasks -------------------------------------------------------------------------------------

tasks_app = typer.Typer(help="Import and validate task folders (instruction + workspace + verifier).", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


@tasks_app.command("import")
def tasks_import(
    src: Path = typer.Argument(..., help="The foreign task set: a PinchBench checkout (or its tasks/), a folder of ClawGym task_*/, or Harbor task folders."),
    dst: Path = typer.Argument(..., help="Folder to write native task folders into (one per task)."),
    source: str = typer.Option(..., "--from", help="pinchbench | clawgym | harbor"),
    force: bool = typer.Option(False, "--force", help="Overwrite task folders that already exist in DST."),
) -> None:
    """Convert a PinchBench, ClawGym or Harbor task set into native task folders.

    Each task keeps its source's scoring rule; a task that cannot be converted is skipped with its reason.

    Example: clawgym tasks import --from clawgym ../shared/tasks/clawgym-bench tasks/clawgym-bench
    """
    from clawgym.tasks.importers import import_tasks

    with err.status(f"importing {source} tasks from {src}"):
        report = import_tasks(source, src, dst, force=force)
    for name, reason in report.skipped:
        err.print(f"[yellow]skipped[/] {name}: {reason}", highlight=False, soft_wrap=True)
    typer.echo(f"imported {len(report.imported)} task(s) into {dst}; skipped {len(report.skipped)}")
    if not report.imported:
        raise typer.Exit(1)


@tasks_app.command("validate")
def tasks_validate(
    path: Path = typer.Argument(..., help="A task folder or a folder of task folders."),
    jobs: int = typer.Option(2, "--jobs", "-j", help="Tasks checked at once."),
    sandbox: str = typer.Option("local", help="Sandbox backend: local | docker."),
    network: str = typer.Option("auto", help="Local sandbox network: auto | bwrap | unshare | blackhole."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the full report as JSON."),
    all_rows: bool = typer.Option(False, "--all", help="List every task, not only those with a problem or a positive no-op score."),
) -> None:
    """Parse every task, run its verifier on the untouched workspace, and report no-op scores and flags.

    Flags say what a task needs beyond files and python3 (network, browser, judge, binary inputs, ...).
    Exits 1 when a task folder is invalid.

    Example: clawgym tasks validate tasks/clawgym-bench --jobs 2
    """
    from clawgym.artifacts import atomic_write_bytes
    from clawgym.rollout.sandbox import SandboxConfig
    from clawgym.tasks.validate import print_report, validate_tasks

    with err.status(f"validating tasks in {path}"):
        report = validate_tasks(path, sandbox=sandbox, sandbox_config=SandboxConfig(network=network), jobs=jobs)
    print_report(report, Console(), show_all=all_rows)
    if json_out:
        atomic_write_bytes(json_out, report.to_json())
    if report.n_invalid:
        raise typer.Exit(1)


# --- looking at artifacts ----------------------------------------------------------------------


@app.command("inspect")
def inspect(
    path: Path = typer.Argument(..., metavar="PATH", help="A Parquet artifact, a JSONL log, a model directory, or a run directory."),
    rollout: Optional[str] = typer.Option(None, help="For trees.parquet: draw this rollout's tree."),
    tokenizer: Optional[Path] = typer.Option(None, help="For trees.parquet: a model dir whose tokenizer decodes node text."),
) -> None:
    """Print a readable summary of any clawgym artifact or model directory.

    Example: clawgym inspect runs/demo/step-0001/calls.parquet
    """
    from clawgym.inspect import inspect_path

    inspect_path(path, Console(), rollout=rollout, tokenizer=tokenizer)


def main() -> None:
    """Console entry point: run the app, turning expected failures into one line and exit 1."""
    from clawgym.artifacts import ArtifactError

    try:
        app()
    except (UserError, ArtifactError) as e:
        err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
