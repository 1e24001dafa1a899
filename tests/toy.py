"""A recipe over a few of the shipped toy tasks, for the loop's tests (learning, resume, mix-harness)."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "tasks" / "toy"


def write_toy_recipe(tmp: Path, name: str, *, algo: str = "grpo", steps: int, n: int, tasks: int,
                     harnesses: str = '["agentloop"]', max_tokens: int = 8, concurrency: int = 8, lr: float = 0.05,
                     train_extra: str = "") -> Path:
    """tmp/NAME.toml training the tiny model on the first `tasks` toy tasks (copied to tmp/tasks)."""
    dest = tmp / "tasks"
    for d in sorted(TOY.iterdir())[:tasks]:
        if not (dest / d.name).exists():
            shutil.copytree(d, dest / d.name)
    path = tmp / f"{name}.toml"
    path.write_text(f"""
[run]
name = "{name}"
steps = {steps}
seed = 0

[model]
init = "tiny"

[rollout]
tasks = "tasks"
harnesses = {harnesses}
group_size = {n}
concurrency = {concurrency}
timeout_s = 60

[rollout.agentloop]
max_turns = 1
max_tokens = {max_tokens}

[train]
algo = "{algo}"
lr = {lr}
{train_extra}
""")
    return path
