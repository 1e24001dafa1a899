"""The engine interface: token ids in, sampled token ids + logprobs out; reload weights from a checkpoint.

The serving proxy renders every request into prompt token ids and hands them to an engine; the
engine never sees text. Engines are looked up by name in `registry.ENGINES` (name -> factory taking an
`EngineConfig`), so adding one (vllm, remote) is a new module plus one dict entry — no registry,
no class names in config.

Contract of `generate`:
- `output_ids` are the sampled ids, ending with the end-of-turn id when the model stopped on its own
  (finish_reason "stop"), or cut at `max_tokens` ("length");
- `output_logprobs[i]` is the engine's logprob of `output_ids[i]` under the distribution it sampled
  from (logits / temperature, before top-p/top-k truncation; temperature 0 counts as 1);
- failures raise `EngineError`, which the proxy turns into the protocol's "overloaded" answer.

An engine that answers from the conversation rather than from token ids alone (the task teacher,
`clawgym.engines.teacher`) follows `ReadsChat` as well: the proxy then calls `generate_chat` with the
request's messages and tools as it parsed them (`Chat`), so the engine reads no rendered text and
works under any chat template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from clawgym.errors import UserError


class EngineError(Exception):
    """The engine could not produce a completion (overloaded, crashed, script exhausted, ...)."""


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one request, as the proxy resolved them from the protocol's fields."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 = no top-k truncation"""
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    """ids that end generation (the proxy passes the tokenizer's end-of-turn ids)"""


@dataclass
class Generation:
    """What the engine sampled for one prompt."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    """stop (an end-of-turn id was sampled) | length (max_tokens reached)"""
    policy_version: int


@dataclass
class EngineConfig:
    """Everything a factory may need; engines ignore what they do not use."""

    model_dir: Path
    options: dict[str, Any] = field(default_factory=dict)
    """engine-specific settings, e.g. {"script": path} for scripted, {"max_batch": 8} for hf"""
    chat_template: str | None = None
    """the proxy's --chat-template (a Jinja file or a shipped name), for an engine that renders text itself (teacher)"""


@dataclass(frozen=True)
class Chat:
    """One call's conversation as the proxy parsed it from the protocol, in the chat-template shape
    (the dicts `tokenizer.apply_chat_template` takes), before any template rendered it."""

    messages: list[dict[str, Any]]
    """{"role": system | user | assistant | tool, "content": str, "tool_calls"?: [...], "tool_call_id"?: str}"""
    tools: list[dict[str, Any]]
    """{"type": "function", "function": {"name", "description", "parameters": JSON schema}}"""


@runtime_checkable
class Engine(Protocol):
    """A policy the proxy can sample from. One instance serves every rollout of a proxy."""

    policy_version: int
    max_context: int
    """the model's context window in tokens (prompt + output)"""

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        """Sample one completion. `rollout_id` lets engines keep rollout-sticky state (scripts, routing)."""
        ...

    async def reload(self, checkpoint_dir: Path) -> int:
        """Load new weights; returns the new policy_version (bumped by one)."""
        ...

    async def close(self) -> None:
        ...


@runtime_checkable
class ReadsChat(Protocol):
    """An engine that answers from the call's conversation (see the module docstring)."""

    async def generate_chat(self, prompt_ids: list[int], chat: Chat, sampling: Sampling, rollout_id: str = "") -> Generation:
        """`generate`'s contract, with the conversation that `prompt_ids` renders."""
        ...


@runtime_checkable
class DropsCache(Protocol):
    """An engine that keeps keys/values between requests (the hf engine's prefix cache) and can let them go."""

    async def drop_cache(self) -> int:
        """Drop every cached key/value after the requests now running; returns the bytes let go. `clawgym run`
        calls it before training in its own process: the weights are about to change, so the cache would be
        dropped at the reload anyway, and the trainer gets its memory meanwhile."""
        ...


@runtime_checkable
class ReportsStats(Protocol):
    """An engine with numbers of its own for the proxy's metrics (the hf engine's prefix cache)."""

    def stats(self) -> dict[str, float]:
        """Flat name -> value; the proxy exports each as the gauge `clawgym_engine_<name>`."""
        ...


def context_window(model_dir: Path) -> int:
    """The model's context window from its config.json (max_position_embeddings), or 32768."""
    import json

    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return 32768
    return int(cfg.get("max_position_embeddings") or 32768)


def load_policy(model_dir: Path, device: str = "cpu"):
    """The checkpoint as the trainer holds it: fp32, eval mode (the hf engine serves exactly this)."""
    import torch
    from transformers import AutoModelForCausalLM

    if not (Path(model_dir) / "config.json").exists():
        raise UserError(f"{model_dir} is not a model directory (no config.json)")
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
