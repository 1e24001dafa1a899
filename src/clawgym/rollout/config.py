"""The rollout stage's configs: `RolloutConfig`, `VerifierConfig`, `JudgeConfig`, and the harness names.

Each `RolloutConfig` field carries its default and help (`clawgym.fields`); `clawgym rollout`'s and
`clawgym eval`'s options and the recipe's [rollout] section are made from these fields (cli/stages.py,
config.py), with `JudgeChoice`'s two for the judge, and docs/config.md lists them. This module imports
neither torch nor the harness adapters, so a recipe loads without them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawgym.engines.registry import ENGINES
from clawgym.errors import UserError
from clawgym.fields import COMMA_LIST, CliForm, key_values, option, same_as
from clawgym.proxy.config import ProxyConfig
from clawgym.proxy.toolparse import AUTO, PARSERS

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


def harness_options(items: list[str], flag: str) -> dict[str, dict[str, Any]]:
    """Repeated HARNESS.KEY=VALUE options as {harness: {key: value}}, like a recipe's [rollout.HARNESS] tables."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in key_values(items, flag).items():
        harness, dot, name = key.partition(".")
        if not dot or not harness or not name:
            raise UserError(f"{flag} expects HARNESS.KEY=VALUE (e.g. agentloop.max_tokens=8), got {key!r}")
        if harness not in HARNESS_NAMES:
            raise UserError(f"{flag} {key}: unknown harness '{harness}'; choose from: {', '.join(HARNESS_NAMES)}")
        out.setdefault(harness, {})[name] = value
    return out


HARNESS_OPTIONS = CliForm(list[str], harness_options,
                          lambda d: [f"{h}.{k}={json.dumps(v)}" for h, kv in d.items() for k, v in kv.items()],
                          "repeatable, e.g. agentloop.max_tokens=1024; VALUE is JSON when it parses", "HARNESS.KEY=VALUE")


@dataclass
class JudgeChoice:
    """The rubric judge as a recipe's [rollout] section and the rollout and eval commands name it; `verifier()` is the config it makes."""

    judge_url: str | None = option(None, "an OpenAI-compatible endpoint of the rubric judge, e.g. http://127.0.0.1:8000/v1; "
                                         "without one, code scores only")
    judge_model: str = option("judge", "the model name the judge is asked for")

    def verifier(self) -> VerifierConfig:
        return VerifierConfig.with_judge(self.judge_url, self.judge_model)


@dataclass(kw_only=True)
class RolloutConfig:
    """Everything one `clawgym rollout` call needs; saved as rollout.config.json beside the output.

    The fields are `clawgym rollout`'s and `clawgym eval`'s options too (cli/): `flag` names an
    option whose flag is not the field's name, `form` writes a list or dict on the command line."""

    tasks: Path = option(help="a task folder or a folder of task folders (docs/tasks.md)")
    harnesses: list[str] = option(help=f"the harnesses to run each task with: {', '.join(HARNESS_NAMES)}",
                                  factory=lambda: ["agentloop"], flag="--harness", metavar="NAME[,NAME]", form=COMMA_LIST)
    out: Path = option(help="the output folder: rollouts.parquet, calls.parquet, records/, results.jsonl (docs/architecture.md)")
    group_size: int = option(1, "rollouts per task and harness: the GRPO group size (in an evaluation, samples per task)",
                             minimum=1, aliases=("--n",))
    concurrency: int = option(4, "rollouts running at once", minimum=1)
    model: Path | None = option(None, "start a proxy in this process serving this model (HF directory); else use a running proxy")
    engine: str = same_as(ProxyConfig, "engine", help=f"the in-process proxy's engine: {' | '.join(ENGINES)} (docs/engines.md)")
    engine_options: dict[str, Any] = same_as(ProxyConfig, "engine_options", help="the in-process proxy engine's options "
                                                                                  "(docs/engines.md)")
    chat_template: str | None = same_as(ProxyConfig, "chat_template", help=(
        "the in-process proxy's chat template: a Jinja file or a shipped one (chatml-tools, smollm2-tools) replacing the "
        "model's own, for a model whose template does not render tools, tool calls and tool results"))
    proxy_url: str | None = option(None, "the URL of a running proxy to use instead of starting one", flag="--proxy")
    admin_token: str | None = option(None, "that proxy's admin token", envvar="CLAWGYM_ADMIN_TOKEN")
    records: Path | None = option(None, "the folder that proxy records into (it must be on this machine's filesystem)")
    timeout_s: float | None = option(None, "wall-clock seconds per rollout; default: each task's [agent] timeout_sec",
                                     flag="--rollout-timeout", aliases=("--timeout",))
    max_calls: int = option(0, "the most model calls a rollout may make; the proxy refuses the next one and the rollout is "
                               "scored as the harness leaves it (status timeout). A turn bound for harnesses without "
                               "their own (Codex, OpenClaw); 0 = no bound", minimum=0)
    sandbox: str = option("local", "local (bubblewrap) | docker | docker:IMAGE | local-unisolated (no file isolation where "
                                   "bubblewrap is missing) (docs/harnesses.md)")
    network: str = option("auto", "the sandbox's network: auto | bwrap | unshare | blackhole | host (docs/architecture.md)")
    step: int = option(0, "the loop step the rollouts belong to, recorded on each")
    policy_version: int = option(0, "the policy version the in-process proxy serves, recorded on each call")
    settle_timeout_s: float = option(30.0, "seconds to wait for the proxy to settle a finished rollout's records", flag="--settle-timeout")
    harness_options: dict[str, dict[str, Any]] = option(help="harness adapter options per harness name, as a recipe's "
                                                             "[rollout.<harness>] tables (docs/harnesses.md)",
                                                        factory=dict, flag="--harness-option", form=HARNESS_OPTIONS)
    verifier: VerifierConfig = option(help="how rollouts are scored: code checks, and the rubric judge when one is given",
                                      factory=VerifierConfig)
    id_prefix: str = option("", "prefix of every rollout id (default: s<step>. for a loop step, none otherwise)")
    task_filter: list[str] = option(help="only these task ids (default: all)", factory=list, metavar="ID[,ID]", form=COMMA_LIST)
    tasks_per_step: int = option(0, "roll out only this many of the tasks, drawn anew for each step (seeded by the step), so "
                                    "a run's steps go through a large task pool; 0 = every task")
    ray: str | None = option(None, "run each rollout as a Ray task on this cluster: auto, local, HOST:PORT or ray://HOST:PORT "
                                   "(docs/scale.md)", metavar="ADDRESS")
    ray_num_cpus: float = option(1.0, "CPUs each rollout task asks Ray for")
    proxy_host: str = same_as(ProxyConfig, "host", help="where the in-process proxy listens; 0.0.0.0 lets the nodes of a Ray cluster reach it")
    tool_parser: str = same_as(ProxyConfig, "tool_parser", help=f"the in-process proxy's tool-call parser: {AUTO} (from the chat template), or one of "
                                    f"{', '.join(PARSERS)} (docs/engines.md)")
