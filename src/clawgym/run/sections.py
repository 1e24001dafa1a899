"""The sections of a recipe, one dataclass each ([run], [model], [engine], [rollout], [trees], [eval],
[sft], [log], [offline], [ray]; [train] is TrainConfig itself). A key that is a stage config's field
is declared with `same_as`, so its help and default have one owner; where the recipe's default
differs on purpose, the section says so beside the key. `recipe.py` reads and checks them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawgym.engines.registry import ENGINES
from clawgym.fields import option, same_as
from clawgym.rollout.config import JudgeChoice, RolloutConfig
from clawgym.train.config import TrainConfig
from clawgym.trees import DEFAULT_MAX_LEAVES


@dataclass
class RunSection:
    name: str = option("run", "the run's name; its directory is runs/<name> beside the recipe unless `dir` is given")
    dir: Path | None = option(None, "the run directory; default runs/<name> beside the recipe")
    steps: int = option(10, "loop steps (rollouts → trees → train → sync)")
    seed: int = option(0, "the training seed: step N trains with seed + N")
    max_staleness: int = option(0, "asynchronous steps: with K >= 1, step k+1's rollouts run while step k trains, the engine "
                                   "serves each new checkpoint as soon as it is written, and every trained token was sampled by "
                                   "a policy at most K versions behind the weights it trains (docs/training.md, \"Asynchronous "
                                   "steps\"); 0: the synchronous loop", minimum=0)
    keep_last: int = option(0, "keep only the last N step checkpoints, and always the latest and the best-eval one "
                               "(older ones are removed as the run goes); 0 keeps every one")


@dataclass
class ModelSection:
    path: Path | None = option(None, "the starting policy: an HF model directory (give this or `init`)")
    init: str | None = option(None, "or make it with init-model into RUN/model-init: a size (tiny | small) or a pretrained name (--from)")
    init_seed: int = option(0, "init-model's seed")


@dataclass
class EngineSection:
    """[engine]: the proxy's engine, parser and template (RolloutConfig's fields), and the engine's options."""

    name: str = same_as(RolloutConfig, "engine", help=f"the proxy's engine: {' | '.join(ENGINES)} (docs/engines.md)")
    tool_parser: str = same_as(RolloutConfig, "tool_parser")
    chat_template: str | None = same_as(RolloutConfig, "chat_template", help="a Jinja file (relative to the recipe) or a shipped "
                                                                             "template name replacing the model's (models/templates.py)")
    options: dict[str, Any] = option(help="every other key of [engine]: the engine's options (docs/engines.md)", factory=dict)


@dataclass
class RolloutSection:
    """[rollout]: the RolloutConfig fields (rollout/config.py) a recipe sets, plus the judge's two
    (JudgeChoice); `Recipe.rollout_config` fills the rest from the step and the other sections."""

    tasks: Path | None = same_as(RolloutConfig, "tasks", default=None)  # None: an [offline] recipe collects nothing
    harnesses: list[str] = same_as(RolloutConfig, "harnesses")
    # a run's default group and pool are 8 rollouts per task (GRPO needs several); `clawgym rollout`'s are 1 and 4
    group_size: int = same_as(RolloutConfig, "group_size", default=8)
    concurrency: int = same_as(RolloutConfig, "concurrency", default=8)
    timeout_s: float | None = same_as(RolloutConfig, "timeout_s")
    max_calls: int = same_as(RolloutConfig, "max_calls")
    sandbox: str = same_as(RolloutConfig, "sandbox")
    network: str = same_as(RolloutConfig, "network")
    harness_options: dict[str, dict[str, Any]] = same_as(RolloutConfig, "harness_options")
    tasks_per_step: int = same_as(RolloutConfig, "tasks_per_step")
    judge_url: str | None = same_as(JudgeChoice, "judge_url")
    judge_model: str = same_as(JudgeChoice, "judge_model")


RENAMED_KEYS = {"rollout": {"timeout": "timeout_s", "n": "group_size"}, "eval": {"n": "samples_per_task"},
                "sft": {"n": "demonstrations"}}
"""recipe keys that were renamed (to their stage config's field, or to say what they count): the old
name still loads for one release, with a one-line notice"""


@dataclass
class TreesSection:
    """[trees]: build-trees' settings; `clawgym build-trees` takes the same field as an option."""

    # Paper §3.2.2 gives no number. A Claude-Code-like rollout with 3 subagents, a compaction and 2 retries has about 8 leaves.
    max_leaves: int = option(DEFAULT_MAX_LEAVES, "a rollout whose tree has more leaves than this is dropped (over-branching)", minimum=1)


@dataclass
class EvalSection:
    every: int = option(0, "evaluate the policy every this many steps (0 = never)")
    tasks: Path | None = option(None, "held-out tasks; default: the rollout tasks")
    samples_per_task: int = option(4, "rollouts per task and harness; a task's Pass@1 is the mean score of its rollouts (also "
                                      "`clawgym eval`'s default)", minimum=1)
    harnesses: list[str] = option(help="default: the rollout harnesses", factory=list)


@dataclass
class RaySection:
    """[ray]: RolloutConfig's Ray fields (ray, ray_num_cpus, proxy_host) under the section's own names."""

    address: str | None = same_as(RolloutConfig, "ray", help="run each rollout as a Ray task: auto | local | HOST:PORT | "
                                                               "ray://HOST:PORT (docs/scale.md)")
    num_cpus: float = same_as(RolloutConfig, "ray_num_cpus")
    proxy_host: str = same_as(RolloutConfig, "proxy_host", help="where the run's proxy listens: 0.0.0.0 on a multi-node cluster, "
                                                               "so the worker nodes reach it")


@dataclass
class SftSection:
    """[sft]: the cold start's teacher rollouts, and the TrainConfig fields of its `train --algo sft`
    (with the cold start's own defaults: a few passes at a high rate over a handful of trajectories)."""

    demonstrations: int = option(0, "teacher trajectories per task–harness pair; 0 = no cold start", minimum=0)
    tasks: Path | None = option(None, "default: the rollout tasks")
    tasks_per_step: int = same_as(RolloutConfig, "tasks_per_step", help="the teacher shows only this many of the tasks, "
                                  "drawn once (seeded as a step 0 draw); 0 = every task")
    harnesses: list[str] = option(help="default: the rollout harnesses", factory=list)
    engine: str = option("teacher", "the engine that plays the teacher, serving the student's tokenizer")
    family: str | None = option(None, "the teacher engine's task family (docs/tasks.md)")
    epochs: int = same_as(TrainConfig, "epochs", default=4, help="passes over the teacher trajectories")
    minibatches: int = same_as(TrainConfig, "minibatches", default=4, help="optimizer steps per epoch")
    lr: float = same_as(TrainConfig, "lr", default=1e-3, help="the cold start's learning rate")
    min_reward: float = same_as(TrainConfig, "min_reward", help="train only on teacher trajectories scoring at least this")


SFT_SHARED_TRAIN_KEYS = ("token_budget", "attention", "max_grad_norm", "aggregation", "activation_checkpointing", "head_chunk")
"""[train] keys the cold start's training takes too (how batches are packed and clipped, and what
memory a forward keeps: the demonstrations are as long as the rollouts); every other TrainConfig
field of the cold start is [sft]'s or TrainConfig's default"""


@dataclass
class LogSection:
    tensorboard: bool = option(False, "also write each metrics line as TensorBoard scalars to RUN/tensorboard "
                                      "(pip install 'clawgym[tensorboard]')")
    wandb: dict[str, Any] = option(help="also log each metrics line to Weights & Biases: {project = \"...\", mode = offline | "
                                        "online | disabled, entity, name, group, tags}; the run folder is RUN/wandb "
                                        "(pip install 'clawgym[wandb]')", factory=dict)


@dataclass
class OfflineSection:
    from_run: Path | None = option(None, "train on this finished run's saved trees instead of collecting rollouts, each step "
                                         "with the train settings that run recorded for it ([train] keys change them; without "
                                         "[model], from the run's own starting policy)")
