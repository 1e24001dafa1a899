"""`TrainConfig`: everything one `train` call needs, each field with its default and help.

The fields drive `clawgym train`'s options, the recipe's [train] section and docs/config.md
(`clawgym.fields`). This module imports no torch, so a recipe loads without it, and
`TrainConfig.validate` refuses a bad setting there as `clawgym train` does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from clawgym.errors import UserError
from clawgym.fields import option

ALGOS = ("grpo", "ppo", "sft")
PRECISIONS = ("fp32", "bf16")
TIS_MODES = ("token", "sequence", "off")
AGGREGATIONS = ("token-mean", "rollout-mean")
ATTENTIONS = ("segments", "dense", "flex")
PER_CALL = frozenset({"trees", "rollouts", "calls", "model", "out", "metrics", "resume", "force"})
"""TrainConfig fields its caller fills for each call (where the batch is, where to write, how to treat
an earlier output): never settings of a recipe's [train] or of a replay"""
HEAD_CHUNK = 256  # scored tokens per LM-head chunk: [256, V] fp32 is 50 MB at V = 49k, 156 MB at 152k


@dataclass
class TrainConfig:
    """Everything one `train` call needs; written next to the checkpoint as train_config.json."""

    trees: Path = option(help="trees.parquet of the step (docs/architecture.md)")
    rollouts: Path = option(help="rollouts.parquet of the step: rewards, groups, status")
    model: Path = option(help="Policy checkpoint to start from (HF directory); its optimizer.pt (moments and step counts; the lr and other settings are this call's) and value/ are reused if present.")
    out: Path = option(help="Checkpoint directory to write (HF format + optimizer + trainer state).")
    calls: Path | None = option(None, "calls.parquet of the step, read for each call's policy_version under --max-staleness "
                                      "(default: beside trees.parquet).")
    algo: str = option("grpo", "grpo | ppo | sft.")
    metrics: Path | None = option(None, "train.jsonl to append to (default: beside trees.parquet).")
    lr: float = option(1e-5, "Policy learning rate (AdamW).")
    epochs: int = option(1, "Passes over the batch; logp_old stays the policy's before the first update.")
    minibatches: int = option(1, "Optimizer steps per epoch; the batch's rollouts are split evenly.")
    clip_low: float = option(0.2, "ε below 1 for the ratio clip.")
    clip_high: float = option(0.2, "ε above 1 for the ratio clip.")
    tis: str = option("token", "Truncated importance sampling against the engine's logprobs: token | sequence | off.")
    tis_cap: float = option(2.0, "Truncation C of the importance weights.")
    kl_coef: float = option(0.0, "β of the k3 KL to --ref-model.")
    ref_model: Path | None = option(None, "Reference policy for the KL term.")
    aggregation: str = option("token-mean", "token-mean | rollout-mean.")
    adv_eps: float = option(1e-6, "ε added to the group's reward std when normalizing GRPO advantages.")
    max_grad_norm: float = option(1.0, "Gradient clipping norm.")
    token_budget: int = option(8192, "Padded tokens per micro-batch (rows × longest row); a longer tree goes alone.")
    head_chunk: int = option(0, f"Scored tokens per LM-head chunk: at most this many rows of [tokens, vocab] logits exist at once "
                                f"(lm_head.py; {HEAD_CHUNK} saves most of the head's memory); 0: all at once, as autograd's own ops do.")
    attention: str = option("auto", "Packed-tree attention: auto (flex on CUDA, segments on CPU) | segments | dense | flex (attention.py).")
    share_prefixes: bool = option(True, "Forward a prefix that rollouts share once: the prompt a minibatch's trees share once per optimizer step "
                                        "(prefix.py; one process or DDP, no sliding window), prefixes shared within a micro-batch once per micro-batch "
                                        "as one trie (trie.py); losses stay per rollout.")
    value_lr: float = option(1e-5, "PPO: value model learning rate.")
    value_warmup_steps: int = option(0, "PPO: value-only updates over the batch before the policy moves.")
    norm_adv: bool = option(True, "PPO: whiten A_t = R − V(s_t) over the batch (weighted mean 0, std 1) before the update.")
    lora_rank: int = option(0, "LoRA: train rank-R adapters instead of every weight (0: full); checkpoints hold them merged.")
    lora_alpha: float = option(16.0, "LoRA: adapter scale (update = alpha / rank · B·A).")
    lora_targets: str = option("all-linear", "LoRA: modules to adapt, comma-separated (q_proj,v_proj) or all-linear.")
    min_reward: float = option(1.0, "SFT: keep rollouts with at least this reward.")
    seed: int = option(0, "Seed for minibatch order and adapter initialization.")
    max_staleness: int | None = option(None, "Asynchronous steps: the most policy versions a rollout's calls may lag the weights "
                                             "trained (--policy-version); a GRPO group with an older call is left out whole. "
                                             "None: no bound (a synchronous step). `clawgym run` sets it from [run] max_staleness.")
    policy_version: int | None = option(None, "The policy version of --model: the optimizer steps its weights had (0: the "
                                              "starting policy); needed with --max-staleness.")
    resume: bool = option(False, "Continue an interrupted call from the epoch checkpoint in --out.", flag="--resume")
    force: bool = option(False, "Overwrite a complete checkpoint in --out.", flag="--force")
    processes: int = option(1, "Data-parallel ranks: > 1 runs this call under accelerate launch --num_processes N (docs/training.md).")
    accelerate_config: Path | None = option(None, "An accelerate config YAML for those ranks; default: DDP over the local devices (--fsdp: sharded).")
    fsdp: bool = option(False, "Shard weights, gradients and optimizer states across the --processes ranks (accelerate's FSDP2 plugin; docs/training.md).",
                        flag="--fsdp")
    precision: str = option("fp32", "fp32 | bf16: bf16 weights and gradients, fp32 master weights and AdamW moments (docs/training.md).")
    memory_limit_gib: float = option(0.0, "GiB this process may hold while training; 0: what it holds when training starts plus the "
                                          "room the machine or its cgroup leaves it. A plan expected to need more trains with smaller "
                                          "micro-batches, or stops in one line before any update (docs/training.md).")
    activation_checkpointing: bool = option(True, "Recompute each decoder layer in the backward instead of storing its activations: "
                                                  "a micro-batch then keeps about a fifth of the memory, for a second forward "
                                                  "(docs/training.md, \"Where a step's memory goes\").")

    def validate(self) -> None:
        """Refuse, in one line, a setting `train` cannot run with. Torch-free: a recipe loader calls it
        at load. What depends on the machine or on this call's inputs (CUDA for flex attention, peft
        for LoRA, the model directory) is checked when `train` starts (train/setup.py)."""
        for name, value, choices in (("algo", self.algo, ALGOS), ("tis", self.tis, TIS_MODES),
                                     ("aggregation", self.aggregation, AGGREGATIONS), ("precision", self.precision, PRECISIONS)):
            if value not in choices:
                raise UserError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")
        if self.processes < 1:
            raise UserError(f"--processes must be at least 1, got {self.processes}")
        if self.accelerate_config is not None and not Path(self.accelerate_config).is_file():
            raise UserError(f"--accelerate-config {self.accelerate_config}: no such file")
        if self.attention not in ("auto", *ATTENTIONS):
            raise UserError(f"--attention must be one of auto, {', '.join(ATTENTIONS)}, got {self.attention!r}")
        for name in ("epochs", "minibatches", "token_budget"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1")
        if self.memory_limit_gib < 0:
            raise UserError(f"--memory-limit-gib must be 0 (what the machine leaves) or more, got {self.memory_limit_gib}")
        if self.head_chunk < 0:
            raise UserError(f"--head-chunk must be 0 (no chunks) or more, got {self.head_chunk}")
        if self.max_staleness is not None and (self.max_staleness < 0 or self.policy_version is None):
            raise UserError(f"--max-staleness must be 0 or more, with --policy-version (the version of --model); got "
                            f"{self.max_staleness} and {self.policy_version}")
        if self.max_staleness and self.tis == "off":
            raise UserError("--max-staleness >= 1 trains tokens an older policy sampled: their behaviour logprobs weight the loss "
                            "(--tis token or sequence), not --tis off")
        if self.kl_coef > 0 and self.ref_model is None:
            raise UserError("--kl-coef > 0 needs --ref-model (the policy to stay close to)")
        if self.lora_rank < 0:
            raise UserError(f"--lora-rank must be 0 (full fine-tuning) or positive, got {self.lora_rank}")
        if self.lora_rank and self.lora_alpha <= 0:
            raise UserError(f"--lora-alpha must be positive, got {self.lora_alpha}")
        if self.lora_rank and not [t for t in self.lora_targets.split(",") if t.strip()]:
            raise UserError("--lora-targets must name modules (e.g. q_proj,v_proj) or be all-linear")
        # A launched rank has processes = 1 and its world size in WORLD_SIZE (distributed.write_spec).
        if self.fsdp and self.processes < 2 and int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise UserError("--fsdp shards across ranks: use it with --processes 2 or more")
        if self.fsdp and self.lora_rank:
            raise UserError("--fsdp with --lora-rank is not supported (the adapters are small: train them data-parallel without --fsdp)")
