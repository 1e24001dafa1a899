"""FSDP for `train --fsdp`: parameters, gradients and AdamW states sharded across the ranks.

The models are sharded by accelerate's FSDP plugin (FSDP2, torch's `fully_shard`): one unit per
decoder layer and accelerate's units for the rest (embeddings, final norm, LM head; the value
head), each parameter a DTensor whose local shard is 1/N of it. A layer's weights are all-gathered
for its forward and backward and freed again, and each micro-batch's gradients are reduce-scattered
into the shards, so besides its shards a rank holds whole weights only of the units in use. Every rank has to make the same
forward/backward calls; the padded micro-batch plans of distributed.py already ensure that.

accelerate applies its FSDP plugin only when the ranks are accelerators; on CPU ranks (gloo) it
falls back to DDP. torch's FSDP2 itself runs on gloo, so `enable` marks the accelerator state as
FSDP there too, and `prepare` then shards on CPU exactly as on GPUs (this is how the CPU tests run).

Checkpoints keep the format of an unsharded run: the full state dicts (weights and optimizer state,
keyed by parameter index as `Optimizer.state_dict` does) are gathered onto rank 0 before it writes,
and a resumed call loads the full optimizer state on every rank, which keeps its own shard.
docs/training.md has the usage and what was tested where.
"""

from __future__ import annotations

from typing import Any

import torch


def plugin(bf16: bool):
    """The FSDP2 plugin: one unit per decoder layer (named later by `wrap_layers`), full state dicts.

    `bf16`: compute in bf16 over fp32 sharded weights (FSDP's mixed precision; the fp32 shards are
    the master weights), gradients reduced in fp32.
    """
    from accelerate import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
    return FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                          auto_wrap_policy="transformer_based_wrap", state_dict_type="FULL_STATE_DICT",
                                          cpu_ram_efficient_loading=False, mixed_precision_policy=mp)


def enable(accelerator, fsdp_plugin) -> None:
    """Make `accelerator.prepare` shard with `fsdp_plugin` on CPU (gloo) ranks too, where accelerate
    otherwise ignores the plugin; on accelerator ranks it is already in effect."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = accelerator.state
    if state.distributed_type == DistributedType.MULTI_CPU:
        # Both states: AcceleratorState copies PartialState's fields again whenever it is created.
        PartialState().distributed_type = state.distributed_type = DistributedType.FSDP
        state.fsdp_plugin = fsdp_plugin


def wrap_layers(fsdp_plugin, lm: torch.nn.Module) -> None:
    """One FSDP unit per decoder layer of `lm` (transformers names them in `_no_split_modules`)."""
    if fsdp_plugin.transformer_cls_names_to_wrap is None:
        fsdp_plugin.transformer_cls_names_to_wrap = list(getattr(lm, "_no_split_modules", None) or [])


def local_numel(module: torch.nn.Module) -> int:
    """Parameter elements this rank holds: its shards of sharded parameters, all of the others."""
    from torch.distributed.tensor import DTensor

    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in module.parameters())


def _options(cpu_offload: bool = True):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """(weights keyed by name, optimizer state keyed by parameter index) of a sharded model, gathered
    onto rank 0 (the other ranks get empty dicts). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    weights = get_model_state_dict(model, options=_options())
    by_name = get_optimizer_state_dict(model, optimizer, options=_options())
    return weights, _to_indices(by_name, _names(model, optimizer)) if by_name else {}


def checkpoint_state(policy, optimizer, value, value_opt, bf16: bool) -> dict:
    """The full state dicts of the sharded models and optimizers, on rank 0, named as save_checkpoint
    takes them; the policy's weights in bf16 under --precision bf16, as an unsharded run saves them."""
    weights, opt = full_state(policy, optimizer)
    # A tied weight (the LM head) comes back as a copy of its own; named once, as HF saves it.
    own = {n for n, _ in policy.named_parameters()} | {n for n, _ in policy.named_buffers()}
    out = {"lm_state": {k.removeprefix("lm."): v.to(torch.bfloat16) if bf16 else v for k, v in weights.items() if k in own},
           "optimizer": opt}
    if value is not None:
        out["value_state"], out["value_optimizer"] = full_state(value, value_opt)
    return out


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Put a full optimizer state (keyed by parameter index, as saved) into the sharded optimizer;
    every rank passes the whole state and keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    names = _names(model, optimizer)
    by_name = {"state": {names[i]: s for i, s in state["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=_options(cpu_offload=False))


def _names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Name of each optimizer parameter, in the optimizer's index order (its groups in turn)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _to_indices(by_name: dict, names: list[str]) -> dict[str, Any]:
    index = {n: i for i, n in enumerate(names)}

    return {"state": {index[n]: s for n, s in by_name["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]]}
