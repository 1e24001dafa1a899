"""Documented config fields: one declaration drives a stage's CLI options, its recipe section and docs/config.md.

A stage config (TrainConfig, RolloutConfig, the recipe sections) declares each field with
`option(default, "what it means")`; the help lives in the field's metadata, where
`cli_parameters` turns it into the command's Typer options, run/recipe.py reads the names and types
of the recipe keys, and `reference` writes the field tables of docs/config.md. So a field added to
a config appears in all three at once, with one default and one help text.

The metadata may also say how the field is written on the command line when that differs from its
name and type: `flag` (`--rollout-timeout` for `timeout_s`), `envvar`, `metavar`, and a `CliForm` for a
list or dict field (`COMMA_LIST`: `--harness a,b` for `harnesses`; `KEY_VALUES`: a repeatable
`--engine-option KEY=VALUE` for `engine_options`), and `minimum`. `parse_cli` turns the command's
values back into the fields' values. `typed` checks a value read from a file (TOML, JSON) against
its field's annotation and `from_text` reads one written as text (`train.lr=0.1`): the one place
strings and file values become typed field values, for recipes, their overrides, replay settings
and the specs the distributed trainer reads. A recipe section's key that is a stage config's field is
declared `same_as(StageConfig, "name")`: one help and one default, the stage config's (or the
section's own where it differs on purpose).

This module imports neither torch nor Typer at import time: loading a recipe stays light.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import tomllib
import types
import typing
from dataclasses import MISSING, Field, dataclass
from pathlib import Path, PurePath
from typing import Any, Callable, Optional

from clawgym.errors import UserError


@dataclass(frozen=True)
class CliForm:
    """How a field whose type has no command-line form of its own (a list, a dict) is written as an option."""

    kind: Any
    """the option's type: str, or list[str] for a repeatable option"""
    parse: Callable[[Any, str], Any]
    """(the option's value, its flag) -> the field's value; a bad value is a UserError naming the flag"""
    show: Callable[[Any], Any]
    """the field's default -> the option's default"""
    syntax: str
    """how the value is written, appended to the field's help on the command line"""
    metavar: str | None = None
    """how --help names the value (the field's own metavar wins)"""


def split_list(text: str, flag: str = "") -> list[str]:
    """A comma-separated option as a list, blanks dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def key_values(items: list[str], flag: str) -> dict[str, Any]:
    """Repeated KEY=VALUE options as a dict; VALUE is JSON when it parses (8, true, 0.5), else a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UserError(f"{flag} expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


COMMA_LIST = CliForm(str, split_list, ",".join, "comma-separated")
KEY_VALUES = CliForm(list[str], key_values, lambda d: [f"{k}={json.dumps(v)}" for k, v in d.items()],
                     "repeatable; VALUE is JSON when it parses", "KEY=VALUE")


def option(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None, flag: str | None = None,
           envvar: str | None = None, metavar: str | None = None, form: CliForm | None = None, minimum: int | None = None,
           aliases: tuple[str, ...] = ()) -> Any:
    """A dataclass field with its help text. Without a default (and no factory) the field is required.
    The rest say how the command line writes it: `flag` overrides the flag (e.g. "--resume" for a bool
    that has no --no- form, "--rollout-timeout" for timeout_s), `envvar` is read when the option is not
    given, `metavar` names the value in --help, `form` writes a list or dict field, `minimum` is
    the smallest number the option takes (a smaller one is a usage error), `aliases` the old flags
    the command line still accepts for one release (shown in --help as the old name)."""
    given = {"flag": flag, "envvar": envvar, "metavar": metavar, "form": form, "minimum": minimum, "aliases": aliases or None}
    metadata = {"help": help} | {k: v for k, v in given.items() if v is not None}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def same_as(cls: type, name: str, *, default: Any = MISSING, help: str | None = None) -> Any:
    """A field that is `cls`'s field `name` again, in another config (a recipe section holding a
    stage config's key): the same help, command-line form and default, so each has one owner.
    `default` gives this config its own default where it differs on purpose, `help` its own words."""
    f = field_of(cls, name)
    metadata = {**f.metadata, **({"help": help} if help is not None else {})}
    if default is not MISSING:
        return dataclasses.field(default=default, metadata=metadata)
    if f.default_factory is not MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata=metadata)
    return dataclasses.field(default=f.default, metadata=metadata)


def help_of(f: Field) -> str:
    return f.metadata.get("help", "")


def cli_help(f: Field) -> str:
    """The option's help as Typer is given it: the field's, then how a list or dict field's value is
    written; square brackets escaped where Typer reads Rich markup, so "[agent]" shows as written."""
    from typer.core import HAS_RICH

    form = f.metadata.get("form")
    text = f"{help_of(f)}; {form.syntax}" if form else help_of(f)
    return text.replace("[", "\\[") if HAS_RICH else text


def flag_of(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


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


def cli_parameters(cls: type, *, skip: set[str] = frozenset(), optional: dict[str, str] | None = None,
                   fields_from: dict[str, type | tuple[type, str]] | None = None) -> list[inspect.Parameter]:
    """Keyword parameters of a Typer command, one `--field-name` option per field of `cls`.

    `skip` leaves fields out (the command fills them); `optional` makes required fields optional on
    the command line, with the given help (the command derives them when not given); `fields_from`
    takes a field's help, default and flag from the same-named field of another config, or from
    (config, name) (`clawgym eval`'s --samples-per-task is RolloutConfig's group_size with the [eval]
    section's samples_per_task's help and default). A field without help still gets its option;
    tests/test_structure.py asks every field for help."""
    import typer

    optional, fields_from = optional or {}, fields_from or {}
    hints = typing.get_type_hints(cls)
    params = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, _ = _optional(hints[f.name])
        origin = fields_from.get(f.name)
        source = f if origin is None else field_of(*origin) if isinstance(origin, tuple) else field_of(origin, f.name)
        default = None if f.name in optional else default_of(source)
        help_text = optional.get(f.name, cli_help(source))
        aliases = (*f.metadata.get("aliases", ()), *(source.metadata.get("aliases", ()) if source is not f else ()))
        if aliases:
            help_text += f" (old name: {', '.join(dict.fromkeys(aliases))})"
        form: CliForm | None = f.metadata.get("form")
        if form is not None:
            kind, default = form.kind, default if default in (MISSING, None) else form.show(default)
        flag = flag_of(source if isinstance(origin, tuple) else f)
        if kind is bool and "/" not in flag and default is True:
            flag = f"{flag}/--no-{flag[2:]}"
        if kind not in (str, int, float, bool, typing.Any, list[str]) and not (isinstance(kind, type) and issubclass(kind, PurePath)):
            raise TypeError(f"{cls.__name__}.{f.name}: type {kind} has no command-line form; give it a CliForm or skip it")
        metavar = f.metadata.get("metavar") or (form.metavar if form else None)
        opt = typer.Option(... if default is MISSING else default, flag, *dict.fromkeys(aliases), help=help_text, envvar=f.metadata.get("envvar"),
                           metavar=metavar, show_default=default not in (MISSING, None, []), min=f.metadata.get("minimum"))
        annotation = Optional[kind] if default is None else kind
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=annotation))
    return params


def parse_cli(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """A command's option values with each of `cls`'s list and dict fields turned from its
    command-line form into the field's value; other keys pass unchanged."""
    out = dict(values)
    for f in dataclasses.fields(cls):
        form = f.metadata.get("form")
        if form is not None and out.get(f.name) is not None:
            out[f.name] = form.parse(out[f.name], flag_of(f))
    return out


def typed(value: Any, annotation: Any, where: str) -> Any:
    """`value` (from TOML, JSON or `from_text`) as a field of type `annotation`: a path string becomes
    a Path, an integer a float where the field is a float; a value of another type is a UserError
    saying `where` (e.g. "recipe.toml [train] key 'lr'") must be of the field's type."""
    kind, nullable = _optional(annotation)
    if value is None and nullable:
        return None
    if kind is Path:
        if not isinstance(value, (str, PurePath)):
            raise UserError(f"{where} must be a path string, got {type(value).__name__}")
        return Path(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is Any:
        return value
    expected = typing.get_origin(kind) or kind
    if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
        raise UserError(f"{where} must be {getattr(expected, '__name__', expected)}, got {type(value).__name__} {value!r}")
    return value


def from_text(text: str, annotation: Any) -> Any:
    """A value written as text (a command line's KEY=VALUE) read by its field's type: a string as
    written, a path resolved from the working directory, a list as TOML or comma-separated, anything
    else as a TOML value; text that is no TOML value stays a string (then `typed` names the key)."""
    kind, _ = _optional(annotation)
    if kind is str:
        return text
    if kind is Path:
        return str(Path(text).resolve())
    if typing.get_origin(kind) is list and not text.lstrip().startswith("["):
        return split_list(text)
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def field_of(cls: type, name: str) -> Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def reference(cls: type, *, skip: set[str] = frozenset(), rename: Callable[[str], str] = lambda n: n,
              options: bool = False, no_option: set[str] = frozenset()) -> str:
    """A Markdown table of the fields of `cls`: key, default, meaning (docs/config.md); with `options`,
    also each field's command-line option ("-" for those in `no_option`)."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    if options:
        rows = ["| key | option | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = default_of(f)
        shown = "required" if default is MISSING else "none" if default is None else f"`{default!r}`".replace("PosixPath", "Path")
        option_cell = "" if not options else " - |" if f.name in no_option else f" `{flag_of(f)}` |"
        rows.append(f"| `{rename(f.name)}` |{option_cell} {shown} | {help_of(f).replace('|', '/')} |")
    return "\n".join(rows)
