"""Engines the serving proxy samples from: token ids in, sampled ids + logprobs out (see `base`)."""

from clawgym.engines.base import Engine, EngineConfig, EngineError, Generation, Sampling
from clawgym.engines.registry import ENGINES, make_engine

__all__ = ["ENGINES", "Engine", "EngineConfig", "EngineError", "Generation", "Sampling", "make_engine"]
