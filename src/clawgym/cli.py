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
