"""The scripted engine: deterministic model outputs for tests, demos and harness integration.

Each rollout has a queue of items; `generate` pops the next one and returns it tokenized by the
model's real tokenizer, followed by the end-of-turn id, with logprobs 0.0. Items come from a JSONL
file (`--script FILE`, one item per line) or from the proxy's admin API at run time. A line is

    {"rollout_id": "r1", "text": "<tool_call>\\n{\\"name\\": \\"Bash\\", ...}\\n</tool_call>"}
    {"rollout_id": "*",  "text": "Done."}              # the shared queue, used when a rollout's own is empty
    {"rollout_id": "r1", "error": "engine down"}       # generate raises EngineError (tests the 529/503 path)
    {"rollout_id": "r1", "text": "slow", "delay_s": 2}  # wait first (tests keep-alive pings)

An exhausted script is an engine error that names the rollout, never a silent default answer.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from clawgym.engines.base import EngineConfig, EngineError, Generation, Sampling, context_window
from clawgym.errors import UserError

SHARED = "*"


@dataclass(frozen=True)
class ScriptItem:
    text: str = ""
    error: str = ""
    delay_s: float = 0.0

    @classmethod
    def parse(cls, raw: Any, where: str) -> "ScriptItem":
        """A string is a text item; a dict may hold text, error and delay_s."""
        if isinstance(raw, str):
            return cls(text=raw)
        if not isinstance(raw, dict):
            raise UserError(f"{where}: a script item must be a string or an object, got {type(raw).__name__}")
        if "text" not in raw and "error" not in raw:
            raise UserError(f"{where}: a script item needs 'text' or 'error'")
        text, error, delay = raw.get("text", ""), raw.get("error", ""), raw.get("delay_s", 0.0)
        if not isinstance(text, str) or not isinstance(error, str):
            raise UserError(f"{where}: 'text' and 'error' must be strings")
        if not isinstance(delay, (int, float)) or delay < 0:
            raise UserError(f"{where}: 'delay_s' must be a number >= 0")
        return cls(text=text, error=error, delay_s=float(delay))


def load_script(path: str | Path) -> dict[str, list[ScriptItem]]:
    """Read a script JSONL file into per-rollout item lists (rollout_id defaults to the shared queue)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"script file {path} does not exist")
    out: dict[str, list[ScriptItem]] = {}
    for i, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise UserError(f"{path}:{i}: not JSON ({e})") from None
        rollout = rec.get("rollout_id", SHARED) if isinstance(rec, dict) else SHARED
        out.setdefault(str(rollout), []).append(ScriptItem.parse(rec, f"{path}:{i}"))
    return out


def text_generation(tokenizer, text: str, sampling: Sampling, policy_version: int) -> Generation:
    """`text` as a completion: its ids under the served model's tokenizer, then end-of-turn, logprobs 0.0."""
    eos_id = tokenizer.eos_token_id
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    stops = set(sampling.stop_token_ids) | {eos_id}
    cut = next((i for i, t in enumerate(ids) if t in stops), None)
    if cut is not None:  # the text itself ends the turn early
        ids = ids[: cut + 1]
    else:
        ids = ids + [eos_id]
    finish = "stop"
    if len(ids) > sampling.max_tokens:
        ids, finish = ids[: sampling.max_tokens], "length"
    return Generation(ids, [0.0] * len(ids), finish, policy_version)


class ScriptedEngine:
    """Per-rollout queues of model texts; see the module docstring."""

    def __init__(self, model_dir: Path, script: dict[str, list[ScriptItem]] | None = None, max_context: int | None = None):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.policy_version = 0
        self.max_context = max_context or context_window(model_dir)
        self.queues: dict[str, collections.deque[ScriptItem]] = collections.defaultdict(collections.deque)
        for rollout, items in (script or {}).items():
            self.queues[rollout].extend(items)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "ScriptedEngine":
        script = load_script(config.options["script"]) if config.options.get("script") else None
        return cls(config.model_dir, script, config.options.get("max_context"))

    def push(self, rollout_id: str, items: list[Any]) -> int:
        """Append items (strings or dicts, as in the file) to a rollout's queue; returns its length."""
        parsed = [ScriptItem.parse(x, f"script item {i}") for i, x in enumerate(items)]
        self.queues[rollout_id].extend(parsed)
        return len(self.queues[rollout_id])

    def remaining(self, rollout_id: str) -> int:
        return len(self.queues.get(rollout_id, ()))

    def _next(self, rollout_id: str) -> ScriptItem:
        for key in (rollout_id, SHARED):
            q = self.queues.get(key)
            if q:
                return q.popleft()
        raise EngineError(f"the script for rollout '{rollout_id}' is exhausted (no items left, shared queue empty)")

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        item = self._next(rollout_id)
        if item.delay_s:
            await asyncio.sleep(item.delay_s)
        if item.error:
            raise EngineError(item.error)
        return text_generation(self.tokenizer, item.text, sampling, self.policy_version)

    async def reload(self, checkpoint_dir: Path) -> int:
        # Nothing to load: a script is not a policy. The version still moves so that the
        # weight-sync path can be exercised end to end without a real model.
        if not Path(checkpoint_dir).exists():
            raise UserError(f"checkpoint {checkpoint_dir} does not exist")
        self.policy_version += 1
        return self.policy_version

    async def close(self) -> None:
        self.queues.clear()
