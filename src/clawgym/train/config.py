"""`TrainConfig`: everything one `train` call needs, each field with its default and help.

The fields drive `clawgym train`'s options, the recipe's [train] section and docs/config.md
(`clawgym.fields`). This module imports no torch, so a recipe loads without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clawgym.fields import option

ALGOS = ("grpo", "ppo", "sft")
PRECISIONS = ("fp32", "bf16")
PER_CALL = frozenset({"trees", "rollouts", "model", "out", "metrics", "resume", "force"})
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
    share_prefixes: bool = option(True, "Forward a prefix that rollouts share (a GRPO group's prompt) once per micro-batch: their trees merge into one trie (trie.py); losses stay per rollout.")
    value_lr: float = option(1e-5, "PPO: value model learning rate.")
    value_warmup_steps: int = option(0, "PPO: value-only updates over the batch before the policy moves.")
    norm_adv: bool = option(True, "PPO: whiten A_t = R − V(s_t) over the batch (weighted mean 0, std 1) before the update.")
    lora_rank: int = option(0, "LoRA: train rank-R adapters instead of every weight (0: full); checkpoints hold them merged.")
    lora_alpha: float = option(16.0, "LoRA: adapter scale (update = alpha / rank · B·A).")
    lora_targets: str = option("all-linear", "LoRA: modules to adapt, comma-separated (q_proj,v_proj) or all-linear.")
    min_reward: float = option(1.0, "SFT: keep rollouts with at least this reward.")
    seed: int = option(0, "Seed for minibatch order and adapter initialization.")
    resume: bool = option(False, "Continue an interrupted call from the epoch checkpoint in --out.", flag="--resume")
    force: bool = option(False, "Overwrite a complete checkpoint in --out.", flag="--force")
    processes: int = option(1, "Data-parallel ranks: > 1 runs this call under accelerate launch --num_processes N (docs/training.md).")
    accelerate_config: Path | None = option(None, "An accelerate config YAML for those ranks; default: DDP over the local devices (--fsdp: sharded).")
    fsdp: bool = option(False, "Shard weights, gradients and optimizer states across the --processes ranks (accelerate's FSDP2 plugin; docs/training.md).",
                        flag="--fsdp")
    precision: str = option("fp32", "fp32 | bf16: bf16 weights and gradients, fp32 master weights and AdamW moments (docs/training.md).")
    activation_checkpointing: bool = option(False, "Recompute each decoder layer in the backward instead of storing its activations.",
                                            flag="--activation-checkpointing")
