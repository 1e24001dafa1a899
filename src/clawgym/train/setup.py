"""The models `train` updates, built once per call: accelerator, policy (LoRA, precision), value model, optimizers.

- `start_ranks`: accelerate's Accelerator (CPU fp32, or CUDA with bf16 autocast; FSDP2 when
  `--fsdp`, fsdp.py) and the process group as `Dist` (distributed.py).
- `load_models`: the policy from the start model (or the interrupted call's checkpoint when
  resuming), its architecture checked from its config and then by a packed-vs-per-path self-test
  (support.py); LoRA adapters (lora.py); bf16 weights with fp32 master weights (precision.py);
  AdamW, its moments reused from the start checkpoint; PPO's value model and its optimizer
  (value.py). accelerate places and wraps them (DDP or FSDP).
- `load_reference`: the frozen policy of the KL term.

Everything here that reads the machine (CUDA, peft, the model directory) is checked by
`check_environment`; the settings themselves by `TrainConfig.validate`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from clawgym.errors import UserError
from clawgym.train import checkpoint as ckpt
from clawgym.train import fsdp, lora
from clawgym.train.attention import implementation
from clawgym.train.config import TrainConfig
from clawgym.train.distributed import Dist, accelerator_kwargs
from clawgym.train.packing import PackedPolicy
from clawgym.train.precision import MasterWeights, enable_activation_checkpointing
from clawgym.train.support import check_config, self_test
from clawgym.train.value import VALUE_DIR, load_value_model

if TYPE_CHECKING:
    from accelerate import Accelerator, FullyShardedDataParallelPlugin


def check_environment(cfg: TrainConfig) -> None:
    """What `cfg` needs of this machine and call: CUDA for flex attention, peft for LoRA, a model directory."""
    if cfg.attention == "flex" and not torch.cuda.is_available():
        raise UserError("--attention flex needs CUDA (FlexAttention has no backward pass on CPU); use segments or dense on CPU")
    if cfg.lora_rank:
        lora.require_peft()
    if not (Path(cfg.model) / "config.json").exists():
        raise UserError(f"{cfg.model}: not a model directory (no config.json)")


def needs_launch(cfg: TrainConfig) -> bool:
    """True outside a launched rank when `cfg` asks for several: `train` then launches them (distributed.launch)."""
    return cfg.processes > 1 and int(os.environ.get("WORLD_SIZE", "1")) == 1


@dataclass
class Ranks:
    """accelerate's Accelerator, the process group as `train` uses it, and the FSDP plugin (None: unsharded)."""

    accelerator: Accelerator
    dist: Dist
    sharding: FullyShardedDataParallelPlugin | None


def autocast_bf16(cfg: TrainConfig) -> bool:
    """Whether fp32 weights compute under bf16 autocast: on CUDA they do (docs/training.md), on CPU not."""
    return torch.cuda.is_available() and cfg.precision == "fp32"


def start_ranks(cfg: TrainConfig) -> Ranks:
    from accelerate import Accelerator

    cuda = torch.cuda.is_available()
    sharding = fsdp.plugin(bf16=cfg.precision == "bf16") if cfg.fsdp else None
    accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if autocast_bf16(cfg) else "no",
                              kwargs_handlers=accelerator_kwargs(), fsdp_plugin=sharding)
    if sharding is not None:
        fsdp.enable(accelerator, sharding)
    return Ranks(accelerator, Dist(accelerator.process_index, accelerator.num_processes), sharding)


@dataclass
class Models:
    """What an update changes: the policy and its optimizer, PPO's value model and its optimizer."""

    policy: torch.nn.Module
    """PackedPolicy, as accelerate wrapped it"""
    optimizer: torch.optim.Optimizer
    master: MasterWeights | None
    """bf16 weights: the fp32 copies the optimizer steps"""
    adapter: object | None
    """LoRA: the peft model whose adapter the checkpoint keeps"""
    value: torch.nn.Module | None
    value_optimizer: torch.optim.Optimizer | None
    fresh_value: bool
    """the value model has no trained head yet: it starts at the batch's mean return"""
    attention: str
    """the packed-tree attention in use (auto resolved)"""
    model_config: object
    n_params: int
    """policy parameter elements in all"""
    params_per_rank: int
    """the most policy parameter elements any one rank holds (under FSDP about 1/N of them)"""


def _load_config(path: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: cannot read the model's config ({e})") from None


def load_models(cfg: TrainConfig, ranks: Ranks, source: Path, resuming: bool) -> Models:
    """The policy (and PPO's value model) from `source` with their optimizers, placed by accelerate.

    `source` is the start model, or `--out` when resuming an interrupted call.
    """
    from transformers import AutoModelForCausalLM

    model_config = _load_config(source)
    attention = cfg.attention if cfg.attention != "auto" else ("flex" if torch.cuda.is_available() else "segments")
    check_config(model_config)
    attn = implementation(attention)
    # Under LoRA the weights stay those of the start model; a resumed call puts its saved adapter back on them.
    model_path = Path(cfg.model) if cfg.lora_rank else source
    # bf16 keeps bf16 weights and fp32 masters beside them; under FSDP the fp32 shards are the masters.
    bf16_weights = cfg.precision == "bf16" and not cfg.fsdp
    try:
        lm = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation=attn,
                                                  dtype=torch.bfloat16 if bf16_weights else torch.float32)
    except (OSError, ValueError) as e:
        raise UserError(f"{model_path}: cannot load the policy ({e})") from None
    self_test(lm, attention)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(lm)
    adapter = None
    if cfg.lora_rank:
        adapter = lora.add_adapter(lm, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets,
                                   resume_from=Path(cfg.out) / lora.ADAPTER_DIR if resuming else None)
    policy = PackedPolicy(lm, cfg.head_chunk)
    master = MasterWeights(lora.trainable(policy)) if bf16_weights else None
    optimizer = torch.optim.AdamW(master.masters if master else lora.trainable(policy), lr=cfg.lr, weight_decay=0.0)
    if ranks.sharding is not None:
        fsdp.wrap_layers(ranks.sharding, lm)
    # A fresh adapter has nothing to do with an earlier step's moments.
    policy, optimizer = _prepare(ranks.accelerator, policy, optimizer, source / ckpt.OPTIMIZER_FILE,
                                 load=resuming or not cfg.lora_rank)
    value, value_optimizer, fresh_value = _load_value(cfg, ranks, source, attn, attention)
    return Models(policy, optimizer, master, adapter, value, value_optimizer, fresh_value, attention, model_config,
                  n_params=sum(p.numel() for p in policy.parameters()),
                  params_per_rank=max(ranks.dist.gather_list([fsdp.local_numel(policy)])))


def _load_value(cfg: TrainConfig, ranks: Ranks, source: Path, attn: str, attention: str):
    """PPO: (value model, its optimizer, fresh), prepared like the policy; otherwise (None, None, False)."""
    if cfg.algo != "ppo":
        return None, None, False
    value, fresh = load_value_model(source, attn)
    self_test(value.backbone, attention)
    value_optimizer = torch.optim.AdamW(value.parameters(), lr=cfg.value_lr, weight_decay=0.0)
    value, value_optimizer = _prepare(ranks.accelerator, value, value_optimizer, source / VALUE_DIR / ckpt.OPTIMIZER_FILE)
    return value, value_optimizer, fresh


def _prepare(accelerator, model, optimizer, saved_optimizer: Path, load: bool = True):
    """accelerate's prepare, with the optimizer state saved at `saved_optimizer` (if any and `load`)
    loaded: before wrapping, or after it under FSDP, where every rank keeps its shard of the full state."""
    sharded = accelerator.is_fsdp2
    if load and not sharded:
        ckpt.load_optimizer(optimizer, saved_optimizer)
    model, optimizer = accelerator.prepare(model, optimizer)
    if load and sharded:
        ckpt.load_optimizer(optimizer, saved_optimizer, apply=lambda state: fsdp.load_optimizer(model, optimizer, state))
    return model, optimizer


def load_reference(cfg: TrainConfig, models: Models, device) -> PackedPolicy:
    """The KL term's reference policy, fp32 on `device`. It is not wrapped (it takes no gradient), so
    its calls need not match across ranks."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(cfg.ref_model, attn_implementation=implementation(models.attention),
                                              dtype=torch.float32)
    return PackedPolicy(lm, cfg.head_chunk).to(device)
