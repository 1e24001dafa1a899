"""Precision and memory options of `train`: bf16 weights with fp32 optimizer state, activation checkpointing.

With `[train] precision = "bf16"` the policy's weights and gradients are bf16 (half the memory of
fp32, no autocast copies), while AdamW runs on fp32 master copies: an update of lr = 1e-5 relative
to a weight is below bf16's resolution (8 bits of mantissa) and would round away if applied to the
bf16 weights directly. Each step copies the bf16 gradients into the masters, steps, and rounds the
masters back into the weights. docs/training.md gives the memory per parameter.

Activation checkpointing keeps only each decoder layer's input and recomputes the layer in the
backward (transformers' own per-layer checkpointing).
"""

from __future__ import annotations

from typing import Iterable

import torch


class MasterWeights:
    """fp32 copies of `params` for the optimizer; `params` keep their own (bf16) dtype for compute."""

    def __init__(self, params: Iterable[torch.nn.Parameter]):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]

    def grads_in(self) -> None:
        """The (all-reduced, clipped) bf16 gradients, as fp32 gradients of the masters."""
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.detach().float()

    @torch.no_grad()
    def weights_out(self) -> None:
        """The stepped masters, rounded into the compute weights."""
        for p, m in zip(self.params, self.masters):
            p.copy_(m)


def enable_activation_checkpointing(lm: torch.nn.Module) -> int:
    """Recompute each decoder layer in the backward; returns how many layers will be.

    transformers checkpoints a layer only while that layer is in training mode, and `train` keeps
    the model in eval mode so dropout stays off (logp_old must equal the first update's logp). So
    the layers themselves, not their submodules, are flagged as training: their dropout-bearing
    children stay in eval mode.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    if hasattr(lm, "activation_checkpointing_enable"):  # transformers ≥ 5's name for it
        lm.activation_checkpointing_enable({"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in lm.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.training = True  # this module only (not .train(), which would recurse)
    return len(layers)
