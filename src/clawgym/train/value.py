"""The PPO value model: the policy's architecture with a scalar head (paper §2.3.1, §3.2.3).

V(s_t) is read at the position whose output predicts token a_t — the same `pred_pos` the policy's
logprobs use — so on a packed tree each state is valued once, with attention restricted to its own
root path exactly as for the policy. With γ = λ = 1 and each trajectory on its own (paper eq. 8),
the advantage is A_t = R − V(s_t) and the value target of every state is the rollout's reward.

The value model has its own checkpoint, a `value/` folder inside the policy checkpoint:
the backbone in HF format (`config.json` + `model.safetensors`) plus `value_head.safetensors`.
A fresh value model starts from the policy's backbone with a zero-weight head whose bias is the
batch's mean return (`start_at`), so V is the best constant before any update; the warm-up stage
(`--value-warmup-steps`) then fits it to the rewards before the policy moves. Starting at zero
instead (or letting Adam find the constant) overshoots: Adam moves every head weight by ~lr at
once, which shifts V by ~lr × hidden size, so V sat near 0.7 against rewards near 0.05 and every
early advantage was negative.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from clawgym.errors import UserError
from clawgym.train.attention import enable_tree_attention, implementation
from clawgym.train.packing import MicroBatch, backbone_forward

HEAD_FILE = "value_head.safetensors"
VALUE_DIR = "value"


class ValueModel(torch.nn.Module):
    """Backbone (the policy's architecture, no LM head) + a linear scalar head."""

    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        enable_tree_attention(backbone)
        self.backbone = backbone
        self.head = torch.nn.Linear(backbone.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, mb: MicroBatch) -> torch.Tensor:
        hidden = backbone_forward(self.backbone, mb)  # [B, L, H]
        h = hidden.reshape(-1, hidden.shape[-1])[mb.pred_index]  # [T, H]: the state before each scored token
        return self.head(h.float()).squeeze(-1)  # [T]

    @torch.no_grad()
    def start_at(self, mean_return: float) -> None:
        """A fresh head: V ≡ `mean_return` (weights zero, bias the mean), the least-squares constant."""
        self.head.weight.zero_()
        self.head.bias.fill_(mean_return)

    def save(self, path: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Write the backbone in HF format and the head beside it; `state` replaces this model's own
        state dict (FSDP: the weights gathered from the shards)."""
        path.mkdir(parents=True, exist_ok=True)
        state = state if state is not None else self.state_dict()
        part = {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}
        self.backbone.save_pretrained(path, state_dict=part)
        head = {k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")}
        save_file({k: v.detach().float().cpu().contiguous() for k, v in head.items()}, path / HEAD_FILE)
        (path / "value_model.json").write_text(json.dumps({"kind": "clawgym-value-model", "head": HEAD_FILE}) + "\n")


def load_value_model(model_dir: Path, attn_implementation: str | None = None) -> tuple[ValueModel, bool]:
    """The value model of checkpoint `model_dir` if it has one, else a fresh one on its backbone.

    Returns (model, fresh). A fresh model has a zero head and needs the warm-up stage.
    """
    from transformers import AutoModel

    attn_implementation = attn_implementation or implementation("segments")
    value_dir = Path(model_dir) / VALUE_DIR
    fresh = not (value_dir / HEAD_FILE).exists()
    src = model_dir if fresh else value_dir
    try:
        backbone = AutoModel.from_pretrained(src, attn_implementation=attn_implementation, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise UserError(f"{src}: cannot load a value backbone ({e})") from None
    model = ValueModel(backbone)
    if not fresh:
        state = load_file(value_dir / HEAD_FILE)
        if set(state) != {"weight", "bias"} or state["weight"].shape != model.head.weight.shape:
            raise UserError(f"{value_dir / HEAD_FILE}: not a value head for this backbone (hidden size {backbone.config.hidden_size})")
        model.head.load_state_dict(state)
    return model, fresh
