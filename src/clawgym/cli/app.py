"""The Typer app every `clawgym` command registers on, and what the commands share: the options
made from a config's fields (`with_fields`), the --json result (`json_result`), and the stop
signals `main` turns into an exit status."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator, Optional

import typer

from clawgym import __version__
from clawgym.console import STDERR
from clawgym.fields import cli_parameters

app = typer.Typer(
    name="clawgym",
    help="Train LLM agents with RL through the agent harnesses people deploy (ClawGym II).",
    epilog="Start here: scripts/install.sh && clawgym run recipes/quickstart.toml (README.md); every doc: docs/README.md "
           "and the README's Docs list. Each command's --help has an example.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = STDERR  # every stage's tables and progress: the one shared console (console.py)


FORCE_HELP = "Start over when --out holds this stage's output made with other settings (a rerun with the same settings resumes)."
JSON_HELP = "Print the result as one JSON object on stdout; tables, progress and the summary line go to stderr."


def with_fields(command: Callable, *configs: type, **how: Any) -> None:
    """Give `command` (whose signature ends in **options) one option per field of each of `configs`
    (`how`: cli_parameters' skip, optional, fields_from); Typer reads the signature, so the options
    are the fields' own names, defaults and help."""
    import inspect

    sig = inspect.signature(command)
    fixed = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    arguments = [p for p in fixed if isinstance(p.default, typer.models.ArgumentInfo)]
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in fixed if p not in arguments]  # e.g. --json, after the fields
    fields = [p for config in configs for p in cli_parameters(config, **how)]
    command.__signature__ = sig.replace(parameters=arguments + fields + rest)


@contextlib.contextmanager
def json_result(as_json: bool) -> Iterator[Callable[[str, dict[str, Any]], None]]:
    """Where a command reports its result: `report(line, data)` prints the human summary line on
    stdout; with --json everything printed inside the block (tables, stage output, the line) goes to
    stderr instead and `data` is printed on stdout as one JSON object once the command succeeded, so
    a script can read stdout whole. A failing command prints no JSON."""
    if not as_json:
        yield lambda line, data: typer.echo(line)
        return
    import orjson

    found: list[dict[str, Any]] = []
    with contextlib.redirect_stdout(sys.stderr):
        yield lambda line, data: (typer.echo(line), found.append(data))
    for data in found:
        typer.echo(orjson.dumps(data, default=str).decode())


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




STOP_SIGNALS: list[int] = []
"""the stop signals this process received: the exit status says which (Typer turns the interrupt
into a plain exit 130, and serve-proxy's event loop takes both signals itself)"""
AFTER_STOP: list[str] = []
"""what a stopped command can be continued with (`run`'s --resume command), said after the stop's line"""
