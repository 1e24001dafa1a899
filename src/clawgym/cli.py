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
