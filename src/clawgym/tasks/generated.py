"""What a generated task family is: `Family` (draw a task, teach its solution), `Drawn`, `Reply` (and `tool_call`, a reply of one call), and the split rule.

Kept apart from the registry (families.py) so that family modules import this and the registry
imports them, with no import circle.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawgym.tasks.writer import TaskDraft

SPLITS = ("train", "heldout")
HELDOUT_SHARE = 4
"""one signature hash in HELDOUT_SHARE belongs to the held-out split"""
MAX_DRAWS = 10_000


@dataclass(frozen=True)
class Drawn:
    """One generated task: its folder contents and its content signature."""

    draft: TaskDraft
    signature: str
    """everything that decides the task's answer, as text; equal signatures are the same task"""


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a teacher's reply: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """The teacher's next assistant message, as content: its text and its tool calls.

    It names no call syntax: the teacher engine renders it with the served model's chat template,
    so the student learns its own template's form (Hermes `<tool_call>{...}`, SmolLM2's JSON list, ...)."""

    text: str = ""
    calls: tuple[ToolCall, ...] = field(default_factory=tuple)


def tool_call(name: str, arguments: dict[str, Any]) -> Reply:
    """A reply that is one tool call and no text (the served chat template decides how it reads)."""
    return Reply(calls=(ToolCall(name, arguments),))


class Family(Protocol):
    name: str
    categories: tuple[str, ...]

    def draw(self, rng: random.Random, category: str, task_id: str) -> Drawn:
        """One task of `category` with id `task_id`, from `rng` only."""
        ...

    def teach(self, instruction: str, tool_results: list[str]) -> Reply:
        """The teacher's next assistant message; ValueError for an instruction not of this family."""
        ...


def split_of(signature: str) -> str:
    """The split a task with this content signature belongs to, whatever seed drew it."""
    h = int.from_bytes(hashlib.sha256(signature.encode()).digest()[:8], "big")
    return "heldout" if h % HELDOUT_SHARE == 0 else "train"
