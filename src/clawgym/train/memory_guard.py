"""Before the first forward: will the step's plan fit the memory this process can have?

A step's peak is the model, its gradients and optimizer state, plus one micro-batch's activations
and LM head, plus the step's shared prefix (its activations and keys/values stay until the
minibatch's last micro-batch; prefix.py). Only the micro-batch term depends on `--token-budget`, so
the check (`fit`) estimates that peak for the costliest micro-batch of the plan and compares it with
what this process may hold: `--memory-limit-gib`, or what it holds now plus the room the machine or
its cgroup leaves it (peak_memory.room). A plan that does not fit is planned again with half the
budget, down to `MIN_BUDGET` tokens; one that never fits (a single tree longer than any budget, or a
model whose static part alone is too large) stops the call with one line naming the figures and the
settings that lower them. Nothing has been written when that happens. The check runs before the
scoring pass, and every rank takes the smallest budget any rank needed (a rank's plan is its shard).

The per-token terms are `memory.estimate`'s (docs/training.md, "What fits on one GPU"), at the
activations' real width (4 B on the CPU, where nothing runs under autocast). On the CPU the packed
attention (attention.py, segments) keeps more than the formula counts: each block's gathered keys
and values, and, under activation checkpointing, the recomputed layer's gradients and the
attention's backward buffers beside its activations. `CPU_OVERHEAD` is that ratio as
bench/train_memory.py measures it on SmolLM2 steps, with and without checkpointing; the bench prints
each step's estimate beside its measured peak, so a drift shows there (docs/training.md, "Where a
step's memory goes").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from clawgym import peak_memory
from clawgym.errors import UserError
from clawgym.train import memory
from clawgym.train.config import TrainConfig
from clawgym.train.microbatches import RankMicroBatches, RankPlan

GIB = memory.GIB
MIN_BUDGET = 512
"""the smallest token budget the check plans with before it gives up"""
CPU_OVERHEAD = {True: 3.2, False: 1.5}
"""measured CPU activation bytes per token / the formula's, with and without activation checkpointing
(bench/train_memory.py: with checkpointing its expected column stays at or above the measured peak;
without, within a few percent of it, which HEADROOM covers)"""
HEADROOM = 0.9
"""the share of the room a plan may use: the estimate is not exact, and the heap is not packed tight"""


@dataclass(frozen=True)
class Need:
    """A plan's expected peak, in bytes, and what it is made of."""

    held: float
    """what the process holds now (weights loaded, the runtime)"""
    static: float
    """gradients, and the optimizer state unless it was loaded"""
    micro_batch: float
    """the costliest micro-batch: activations and LM head"""
    prefix: float
    """the step's shared prefix: activations and keys/values kept across micro-batches"""
    tokens: int
    trainable: int
    prefix_tokens: int

    @property
    def total(self) -> float:
        return self.held + self.static + self.micro_batch + self.prefix


def sizes(trees, plan: RankPlan) -> tuple[list[tuple[int, int]], int]:
    """(padded tokens, scored-trainable tokens) of each planned micro-batch, and the shared prefix's tokens."""
    out = [(len(parts) * max(p.n_tokens for p in parts), sum(trees[i].n_trainable for i in rows))
           for rows, parts in (planned for planned in plan if planned is not None)]
    return out or [(0, 0)], len(plan.prefix) if plan.prefix is not None else 0


def need(cfg: TrainConfig, shape: memory.Shape, world: int, device: torch.device, trees, plan: RankPlan,
         held: float, optimizer_ready: bool, ppo: bool) -> Need:
    """The expected peak of training `plan` (module docstring)."""
    shards = world if cfg.fsdp else 1
    bf16 = cfg.precision == "bf16" or device.type == "cuda"  # CUDA runs under bf16 autocast
    act_bytes = 2 if bf16 else 4
    e = memory.estimate(shape, precision=cfg.precision, lora_rank=cfg.lora_rank, fsdp=shards,
                        activation_checkpointing=cfg.activation_checkpointing, head_chunk=cfg.head_chunk)
    overhead = CPU_OVERHEAD[cfg.activation_checkpointing] if device.type == "cpu" else 1.0
    per_token = e.act_per_token * act_bytes / 2 * overhead  # the formula counts bf16 activations
    steps, prefix_tokens = sizes(trees, plan)
    # the costliest micro-batch: activations follow its tokens, the LM head its trainable ones
    micro, tokens, trainable = max((t * per_token + k * e.head_per_trainable_token + e.head_fixed, t, k) for t, k in steps)
    static = e.grads + (0.0 if optimizer_ready else e.optimizer)  # gradients exist from the first backward on
    if ppo:  # the value model's update: its own activations (no checkpointing), gradients and moments
        full = memory.estimate(shape, activation_checkpointing=False).act_per_token * act_bytes / 2 * \
            (CPU_OVERHEAD[False] if device.type == "cpu" else 1.0)
        micro = max(micro, tokens * full)
        static += 0.0 if optimizer_ready else e.params * 16 / shards
    kept = (2 * shape.hidden * shape.layers if cfg.activation_checkpointing else e.act_per_token) * act_bytes / 2
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * act_bytes * 3  # recorded, the leaves, their gradients
    return Need(held, static, micro, prefix_tokens * (kept * overhead + kv), tokens, trainable, prefix_tokens)


def limit(cfg: TrainConfig, world: int, device: torch.device, held: float) -> tuple[float, str]:
    """The bytes this process may hold in all, and where that figure comes from."""
    if cfg.memory_limit_gib > 0:
        return cfg.memory_limit_gib * GIB, "--memory-limit-gib"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return held + free, "the GPU's free memory"
    room = peak_memory.room()
    if room is None:
        return float("inf"), "no reading"
    return held + room[0] / max(world, 1), room[1] + (f" shared by {world} ranks" if world > 1 else "")


def held_now(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    return float(peak_memory.status_bytes("VmRSS") or 0)


def fit(cfg: TrainConfig, micro: RankMicroBatches, rows: Sequence[int], shape: memory.Shape, *,
        optimizer_ready: bool, ppo: bool, say: Callable[[str], None]) -> RankPlan:
    """This rank's plan of `rows` at the largest budget (`--token-budget`, halved as needed) whose
    expected peak fits; sets `micro.token_budget` to it. A UserError when none fits."""
    device, dist = micro.accelerator.device, micro.dist
    held = held_now(device)
    have, source = limit(cfg, dist.world, device, held)
    first = None
    while True:
        plan = micro.plan(rows)
        n = need(cfg, shape, dist.world, device, micro.trees, plan, held, optimizer_ready, ppo)
        first = first or n
        fits = all(dist.gather_list([n.total <= have * HEADROOM]))
        if fits:
            if micro.token_budget < cfg.token_budget:
                say(f"memory: {_figures(first)} is {first.total / GIB:.1f} GiB, more than {HEADROOM:.0%} of the "
                    f"{have / GIB:.1f} GiB this process can have ({source}): planned with {micro.token_budget:,}-token "
                    f"micro-batches instead of {cfg.token_budget:,} (expected peak {n.total / GIB:.1f} GiB)")
            else:
                say(f"memory: expected peak {n.total / GIB:.1f} GiB of {_gib(have)} this process can have "
                    f"({source}); costliest micro-batch {n.tokens:,} tokens ({n.trainable:,} trainable)"
                    + (f", after a shared prefix of {n.prefix_tokens:,} tokens" if n.prefix_tokens else ""))
            return plan
        smaller = micro.token_budget // 2
        if smaller < MIN_BUDGET or _one_tree(plan):
            raise UserError(_refusal(cfg, n, have, source, micro.token_budget))
        micro.token_budget = smaller


def _gib(b: float) -> str:
    return "the unknown memory" if b == float("inf") else f"the {b / GIB:.1f} GiB"


def _one_tree(plan: RankPlan) -> bool:
    """Whether the largest micro-batch is a single rollout's tree, which no smaller budget can split."""
    sizes = [(len(p[1]) * max(t.n_tokens for t in p[1]), len(p[0])) for p in plan if p is not None]
    return bool(sizes) and max(sizes)[1] == 1


def _figures(n: Need) -> str:
    prefix = f", after a shared prefix of {n.prefix_tokens:,} tokens" if n.prefix_tokens else ""
    return f"the expected peak with the costliest micro-batch ({n.tokens:,} tokens, {n.trainable:,} trainable{prefix})"


def _refusal(cfg: TrainConfig, n: Need, have: float, source: str, budget: int) -> str:
    parts = (f"held now {n.held / GIB:.1f} + gradients and optimizer {n.static / GIB:.1f} + micro-batch "
             f"{n.micro_batch / GIB:.1f} + shared prefix {n.prefix / GIB:.1f}")
    settings = [s for s, on in (("--activation-checkpointing", not cfg.activation_checkpointing),
                                ("--head-chunk 256", cfg.head_chunk == 0), ("--lora-rank 16", not cfg.lora_rank),
                                ("--precision bf16", cfg.precision == "fp32")) if on]
    return (f"memory: {_figures(n)} at a {budget:,}-token budget is {n.total / GIB:.1f} GiB ({parts}), more than "
            f"{HEADROOM:.0%} of the {have / GIB:.1f} GiB this process can have ({source}), and no smaller budget fits"
            f"{'; try ' + ', '.join(settings) if settings else ''}, shorter rollouts ([rollout] max_calls), or a larger machine")
