"""The engines by name: `ENGINES` (name -> factory taking an EngineConfig), `make_engine` and `check_engine`.

Apart from base.py so that the engines import their shared types from base without base importing them.
The `teacher` engine is a task family's solver and lives with the families (`clawgym.tasks.teacher`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from clawgym.engines.base import Engine, EngineConfig
from clawgym.errors import UserError


def _hf(config: EngineConfig) -> Engine:
    from clawgym.engines.hf import HFEngine

    return HFEngine.from_config(config)


def _scripted(config: EngineConfig) -> Engine:
    from clawgym.engines.scripted import ScriptedEngine

    return ScriptedEngine.from_config(config)


def _teacher(config: EngineConfig) -> Engine:
    from clawgym.tasks.teacher import TeacherEngine

    return TeacherEngine.from_config(config)


def _teacher_options(options: dict[str, Any]) -> None:
    from clawgym.tasks.teacher import check_options

    check_options(options)


def _vllm(config: EngineConfig) -> Engine:
    from clawgym.engines.vllm import VLLMEngine

    return VLLMEngine.from_config(config)


def _remote(config: EngineConfig) -> Engine:
    from clawgym.engines.remote import RemoteEngine

    return RemoteEngine.from_config(config)


# Name -> factory. Factories import lazily so that `import clawgym.engines` stays cheap.
ENGINES: dict[str, Callable[[EngineConfig], Engine]] = {
    "hf": _hf,
    "scripted": _scripted,
    "teacher": _teacher,
    "vllm": _vllm,
    "remote": _remote,
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
