"""The engines by name: `ENGINES` (name -> factory taking an EngineConfig) and `make_engine`.

Apart from base.py so that the engines import their shared types from base without base importing them.
"""

from __future__ import annotations

from typing import Callable

from clawgym.engines.base import Engine, EngineConfig
from clawgym.errors import UserError


def _hf(config: EngineConfig) -> Engine:
    from clawgym.engines.hf import HFEngine

    return HFEngine.from_config(config)


def _scripted(config: EngineConfig) -> Engine:
    from clawgym.engines.scripted import ScriptedEngine

    return ScriptedEngine.from_config(config)


def _teacher(config: EngineConfig) -> Engine:
    from clawgym.engines.teacher import TeacherEngine

    return TeacherEngine.from_config(config)


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


def make_engine(name: str, config: EngineConfig) -> Engine:
    """Build the engine called `name`; a clear error names the known ones."""
    if name not in ENGINES:
        raise UserError(f"unknown engine '{name}'; choose one of: {', '.join(sorted(ENGINES))}")
    return ENGINES[name](config)
