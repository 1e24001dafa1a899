"""LoRA with peft: train low-rank adapters on the tree path, checkpoint the merged model + the adapter.

With `lora_rank > 0` the policy's chosen linear layers get adapters (peft's LoRA, injected in
place, so `PackedPolicy` and tree attention see the same transformers model) and only the
adapters train: the optimizer holds A and B of each adapted layer, not the full weights.

Each checkpoint has the adapter merged into plain HF weights (W + B·A·alpha/rank), so the hf engine
and vLLM reload it as an ordinary model, and also keeps the adapter itself in `adapter/` (peft
format). A resumed call loads its start model again and puts that adapter back on it; a new
`train` call (the next step of `clawgym run`) starts a fresh adapter on the previous step's merged
weights, so the adapters of successive steps add up in the policy. docs/recipes.md has the keys.
"""

from __future__ import annotations

from pathlib import Path

import torch

from clawgym.errors import UserError

ADAPTER_DIR = "adapter"


def require_peft() -> None:
    """peft is an optional extra; its absence is one line naming it (the settings are checked by TrainConfig.validate)."""
    try:
        import peft  # noqa: F401
    except ImportError:
        raise UserError("--lora-rank needs peft: pip install 'clawgym[lora]'") from None


def _targets(targets: str) -> str | list[str]:
    names = [t.strip() for t in targets.split(",") if t.strip()]
    return "all-linear" if names == ["all-linear"] else names


def add_adapter(lm: torch.nn.Module, rank: int, alpha: float, targets: str, resume_from: Path | None = None):
    """Inject LoRA adapters into `lm` (in place) and return the peft model that saves them.

    A fresh adapter has B = 0, so the policy starts exactly at `lm`; `resume_from` loads a saved
    adapter instead. Only the adapter's parameters require grad afterwards.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    if resume_from is not None:
        if not (resume_from / "adapter_config.json").exists():
            raise UserError(f"{resume_from}: missing; this checkpoint was not written by a LoRA train call")
        return PeftModel.from_pretrained(lm, resume_from, is_trainable=True)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=_targets(targets), lora_dropout=0.0, bias="none")
    try:
        return get_peft_model(lm, config)
    except ValueError as e:
        raise UserError(f"--lora-targets {targets!r}: {e}".splitlines()[0]) from None


def merged_state_dict(lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain HF state dict of a LoRA-injected model with every adapter merged into its weight.

    Computed beside the training weights (nothing is merged in place), so training goes on unchanged.
    """
    deltas = {f"{name}.weight": m.get_delta_weight(m.active_adapters[0]).detach()
              for name, m in lm.named_modules() if hasattr(m, "get_delta_weight") and hasattr(m, "base_layer")}
    out = {}
    for key, value in lm.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = value + deltas[key] if key in deltas else value
    return out


def trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should hold: all of them, or only the adapters under LoRA."""
    return [p for p in module.parameters() if p.requires_grad]
