"""Documented config fields: one declaration drives a stage's CLI options, its recipe section and docs/config.md.

A stage config (TrainConfig, RolloutConfig, the recipe sections) declares each field with
`option(default, "what it means")`; the help lives in the field's metadata, where
`cli_parameters` turns it into the command's Typer options, config.py reads the names and types
of the recipe keys, and `reference` writes the field tables of docs/config.md. So a field added to
a config appears in all three at once, with one default and one help text.

This module imports neither torch nor Typer at import time: loading a recipe stays light.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from dataclasses import MISSING, Field
from pathlib import PurePath
from typing import Any, Callable, Optional


def option(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None, flag: str | None = None) -> Any:
    """A dataclass field with its help text; `flag` overrides the CLI flag (e.g. "--resume" for a bool
    that has no --no- form). Without a default (and no factory) the field is required."""
    metadata = {"help": help} | ({"flag": flag} if flag else {})
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def help_of(f: Field) -> str:
    return f.metadata.get("help", "")


def default_of(f: Field) -> Any:
    """The field's default (a factory's value), or MISSING when it is required."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def _optional(annotation: Any) -> tuple[Any, bool]:
    """(the type inside `X | None`, whether None is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def cli_parameters(cls: type, *, skip: set[str] = frozenset(), optional: dict[str, str] | None = None) -> list[inspect.Parameter]:
    """Keyword parameters of a Typer command, one `--field-name` option per field of `cls`.

    `skip` leaves fields out (the command fills them); `optional` makes required fields optional on
    the command line, with the given help (the command derives them when not given). A field
    without help still gets its option; tests/test_structure.py asks every field for help."""
    import typer

    optional = optional or {}
    hints = typing.get_type_hints(cls)
    params = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, _ = _optional(hints[f.name])
        default = default_of(f)
        help_text = optional.get(f.name, help_of(f))
        if f.name in optional:
            default = None
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if kind is bool and "/" not in flag and default is True:
            flag = f"{flag}/--no-{flag[2:]}"
        if kind not in (str, int, float, bool, typing.Any) and not (isinstance(kind, type) and issubclass(kind, PurePath)):
            raise TypeError(f"{cls.__name__}.{f.name}: type {kind} has no command-line form; skip it")
        opt = typer.Option(... if default is MISSING else default, flag, help=help_text, show_default=default not in (MISSING, None))
        annotation = Optional[kind] if default is None else kind
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=annotation))
    return params


def reference(cls: type, *, skip: set[str] = frozenset(), rename: Callable[[str], str] = lambda n: n) -> str:
    """A Markdown table of the fields of `cls`: key, default, meaning (docs/config.md)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = default_of(f)
        shown = "required" if default is MISSING else "none" if default is None else f"`{default!r}`".replace("PosixPath", "Path")
        rows.append(f"| `{rename(f.name)}` | {shown} | {help_of(f).replace('|', '/')} |")
    return "\n".join(rows)
