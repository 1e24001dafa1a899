"""The teacher engine: a generated task family's solver, served through the proxy like any policy.

An SFT cold start (docs/recipes.md `[sft]`) needs teacher trajectories recorded exactly as a real
teacher model's would be: the harness runs unmodified, every call goes through the proxy, the
proxy renders the prompt with the *served model's* tokenizer and chat template and records the
tokens. This engine stands where that teacher model would: it reads the rendered prompt back as
text, finds the task's instruction and the tool results so far, asks the family
(`clawgym.tasks.families`, option `family`) for the next assistant message, and returns it as
token ids of the served model's tokenizer. So the recorded ids are the student's own, and the
trees, packing and `train --algo sft` see nothing different from a real teacher.

The teacher reads ChatML prompts (`<|im_start|>user ... <|im_end|>`, Hermes `<tool_response>`
blocks): the init-model template, Qwen3 and SmolLM2 use them. A prompt in which it finds no
instruction of its family is an engine error naming the rollout, never a made-up answer.
"""

from __future__ import annotations

import re
from pathlib import Path

from clawgym.engines.base import EngineConfig, EngineError, Generation, Sampling, context_window
from clawgym.engines.scripted import text_generation
from clawgym.errors import UserError

_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)


def read_prompt(text: str) -> tuple[str, list[str]]:
    """(the first user message that is not tool results, every tool result in order) of a ChatML prompt."""
    users = [u for u in _USER.findall(text) if not u.lstrip().startswith("<tool_response>")]
    return (users[0] if users else ""), _TOOL_RESPONSE.findall(text)


class TeacherEngine:
    """See the module docstring."""

    def __init__(self, model_dir: Path, family: str, max_context: int | None = None):
        from transformers import AutoTokenizer

        from clawgym.tasks.families import get_family

        self.family = get_family(family)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.policy_version = 0
        self.max_context = max_context or context_window(model_dir)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "TeacherEngine":
        family = config.options.get("family")
        if not isinstance(family, str):
            raise UserError("the teacher engine needs the option 'family' (a generated task family, e.g. lookup)")
        return cls(config.model_dir, family, config.options.get("max_context"))

    async def generate(self, prompt_ids: list[int], sampling: Sampling, rollout_id: str = "") -> Generation:
        instruction, results = read_prompt(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        try:
            text = self.family.teach(instruction, results)
        except ValueError as e:
            raise EngineError(f"teacher '{self.family.name}' cannot answer rollout '{rollout_id}': {e}") from None
        return text_generation(self.tokenizer, text, sampling, self.policy_version)

    async def reload(self, checkpoint_dir: Path) -> int:
        raise EngineError("the teacher engine serves a fixed solver; it has no weights to reload")

    async def close(self) -> None:
        pass
