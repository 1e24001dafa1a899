"""The engines by name: `ENGINES` (name -> factory taking an EngineConfig), `make_engine` and `check_engine`.

Apart from base.py so that the engines import their shared types from base without base importing them.
The `teacher` engine is a task family's solver and lives with the families (`clawgym.engines.teacher`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

from clawgym.engines.base import Engine, EngineConfig
from clawgym.errors import UserError


def _built_by(module: str, cls: str) -> Callable[[EngineConfig], Engine]:
    """The factory of engine class `cls` in `module`, imported on first use: building one engine
    must not import every other engine's stack (torch, vLLM, aiohttp)."""
    def build(config: EngineConfig) -> Engine:
        return getattr(importlib.import_module(module), cls).from_config(config)

    return build


def _teacher_options(options: dict[str, Any]) -> None:
    importlib.import_module("clawgym.engines.teacher").check_options(options)


# Name -> factory; each imports its engine's module when it builds one.
ENGINES: dict[str, Callable[[EngineConfig], Engine]] = {
    "hf": _built_by("clawgym.engines.hf", "HFEngine"),
    "scripted": _built_by("clawgym.engines.scripted", "ScriptedEngine"),
    "teacher": _built_by("clawgym.engines.teacher", "TeacherEngine"),
    "vllm": _built_by("clawgym.engines.vllm", "VLLMEngine"),
    "remote": _built_by("clawgym.engines.remote", "RemoteEngine"),
}


# Name -> a check of the options alone, for an engine that can refuse bad options before anything
# loads (a recipe is checked when it loads, before its run writes anything); it raises UserError.
def _scripted_options(options: dict[str, Any]) -> None:
    script = options.get("script")
    if script is not None and not Path(script).is_file():
        raise UserError(f"--script {script}: no such file")


OPTION_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "teacher": _teacher_options,
    "scripted": _scripted_options,
}


RELOADS_IN_PLACE = frozenset({"hf", "scripted", "vllm", "remote"})
"""engines that take a new checkpoint while they serve, without a restart: what an asynchronous run
([run] max_staleness >= 1) needs; the teacher engine has no weights"""


def check_engine(name: str, options: dict[str, Any]) -> None:
    """What `make_engine` would refuse that can be seen without building the engine: an unknown name,
    or options its `OPTION_CHECKS` entry refuses. One-line UserErrors."""
    if name not in ENGINES:
        raise UserError(f"unknown engine '{name}'; choose one of: {', '.join(sorted(ENGINES))}")
    if (check := OPTION_CHECKS.get(name)) is not None:
        check(options)


def make_engine(name: str, config: EngineConfig) -> Engine:
    """Build the engine called `name`; a clear error names the known ones."""
    check_engine(name, config.options)
    return ENGINES[name](config)
