"""What a generated task family is: `Family` (draw a task, teach its solution), `Drawn`, and the split rule.

Kept apart from the registry (families.py) so that family modules import this and the registry
imports them, with no import circle.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Protocol

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


class Family(Protocol):
    name: str
    categories: tuple[str, ...]

    def draw(self, rng: random.Random, category: str, task_id: str) -> Drawn:
        """One task of `category` with id `task_id`, from `rng` only."""
        ...

    def teach(self, instruction: str, tool_results: list[str]) -> str:
        """The teacher's next assistant message (text, tool calls in the Hermes `<tool_call>` form)."""
        ...


def split_of(signature: str) -> str:
    """The split a task with this content signature belongs to, whatever seed drew it."""
    h = int.from_bytes(hashlib.sha256(signature.encode()).digest()[:8], "big")
    return "heldout" if h % HELDOUT_SHARE == 0 else "train"
