"""The rollout stage's configs: `RolloutConfig`, `VerifierConfig`, `JudgeConfig`, and the harness names.

Each `RolloutConfig` field carries its default and help (`clawgym.fields`); the recipe's [rollout]
section is made from these fields (config.py) and docs/config.md lists them. This module imports
neither torch nor the harness adapters, so a recipe loads without them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawgym.fields import option

HARNESS_NAMES = ("agentloop", "claude-code", "codex", "openclaw")
"""the keys of `rollout.harnesses.HARNESSES` (a test keeps them equal), for checking a recipe without importing the adapters"""


@dataclass
class JudgeConfig:
    base_url: str
    """an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1"""
    model: str
    api_key: str = field(default_factory=lambda: os.environ.get("CLAWGYM_JUDGE_API_KEY", "EMPTY"), repr=False)
    timeout_s: float = 120.0
    max_retries: int = 2
    """extra attempts when the call fails or its answer breaks the JSON contract"""
    temperature: float = 0.0
    max_tokens: int = 4096
    max_file_chars: int = 20_000
    max_total_chars: int = 120_000


@dataclass
class VerifierConfig:
    judge: JudgeConfig | None = None
    code_weight: float | None = None
    """override the task's weights (both or neither); normalized to sum 1"""
    rubric_weight: float | None = None
    timeout_s: float | None = None
    """override the task's [verifier] timeout_sec"""
    rubric_aggregate: str = "mean"
    """mean (PinchBench, ClawGym) | weighted (by the rubric's criterion weights)"""

    @classmethod
    def with_judge(cls, judge_url: str | None, judge_model: str = "judge") -> "VerifierConfig":
        """Code checks, plus the rubric judge at `judge_url` when there is one (the CLI's and recipes' options)."""
        return cls(judge=JudgeConfig(base_url=judge_url, model=judge_model) if judge_url else None)


@dataclass
class RolloutConfig:
    """Everything one `clawgym rollout` call needs; saved as rollout.config.json beside the output."""

    tasks: Path = option(help="a folder of task folders (docs/tasks.md)")
    harnesses: list[str] = option(help=f"the harnesses to run each task with: {', '.join(HARNESS_NAMES)}")
    out: Path = option(help="the folder the rollouts' tables are written to")
    n: int = option(1, "rollouts per task and harness (the GRPO group size)")
    concurrency: int = option(4, "rollouts running at once")
    model: Path | None = option(None, "start a proxy in process serving this model (else use `proxy_url`)")
    engine: str = option("hf", "the in-process proxy's engine (docs/engines.md)")
    engine_options: dict[str, Any] = option(help="the engine's options", factory=dict)
    chat_template: str | None = option(None, "the in-process proxy renders with this Jinja file or shipped template instead of the model's")
    proxy_url: str | None = option(None, "a running proxy to use instead of starting one")
    admin_token: str | None = option(None, "that proxy's admin token")
    records: Path | None = option(None, "where an external proxy writes its records (it must be on this machine's filesystem)")
    timeout_s: float | None = option(None, "wall-clock seconds per rollout; default: each task's [agent] timeout_sec")
    sandbox: str = option("local", "local | docker (docs/architecture.md)")
    network: str = option("auto", "the sandbox's network: auto | bwrap | unshare | blackhole | host (docs/architecture.md)")
    step: int = option(0, "the loop step the rollouts belong to")
    policy_version: int = option(0, "the policy version the in-process proxy serves")
    settle_timeout_s: float = option(30.0, "seconds to wait for the proxy to settle a finished rollout's records")
    harness_options: dict[str, dict[str, Any]] = option(help='constructor arguments per harness name, e.g. {"agentloop": {"max_turns": 4}}',
                                                        factory=dict)
    verifier: VerifierConfig = option(help="how rollouts are scored: code checks, and the rubric judge when one is given",
                                      factory=VerifierConfig)
    id_prefix: str = option("", "prefix of every rollout id (default: s<step>. for a loop step, none otherwise)")
    task_filter: list[str] = option(help="only these task ids (default: all)", factory=list)
    ray: str | None = option(None, "run each rollout as a Ray task on this cluster: 'auto', 'local', HOST:PORT or ray://HOST:PORT (distributed.py)")
    ray_num_cpus: float = option(1.0, "CPUs each rollout task asks Ray for")
    proxy_host: str = option("127.0.0.1", "where the in-process proxy (`model`) listens; 0.0.0.0 lets other nodes of a Ray cluster reach it")
    tool_parser: str = option("auto", "the in-process proxy's tool-call parser (a name in clawgym.proxy.toolparse.PARSERS, or auto)")
