"""One optimizer update of `train` over a minibatch, returning its metrics as a typed `UpdateStats`.

`update` accumulates the minibatch's loss over this rank's micro-batches (microbatches.py) with
aggregation weights that make the sum a token-mean (or rollout-mean) of the whole minibatch, steps
the policy's optimizer once (through fp32 master weights under bf16), then PPO's value model once on
the same micro-batches. The loss per token (losses.py):

    GRPO / PPO:  w_TIS · clipped surrogate(logp, logp_old, A)  [+ β · k3 KL(π‖ref)]
    SFT:         −logp

Every metric is a weighted mean over the minibatch's scored tokens, summed over ranks. The
fields of `UpdateStats` are the names of train.jsonl's keys (`train/<field>`), each reduced over
a step by step_metrics.REDUCTIONS.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields

import torch

from clawgym import peak_memory
from clawgym.train import losses as L
from clawgym.train.batch import Batch, Scores
from clawgym.train.config import TrainConfig
from clawgym.train.distributed import Dist
from clawgym.train.microbatches import RankMicroBatches, RankPlan
from clawgym.train.setup import Models


class _Metrics:
    def metrics(self) -> dict[str, float]:
        """The train.jsonl values: `train/<field>` for each field that was measured (not None)."""
        return {f"train/{f.name}": getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class UpdateStats(_Metrics):
    """One update's train.jsonl line; None: not measured in this run (no KL reference, no value model)."""

    loss: float
    pg_loss: float
    """the clipped surrogate alone (without TIS weights and the KL term); 0 under SFT"""
    kl_ref: float | None
    clip_frac: float
    tis_clip_frac: float
    entropy: float
    mismatch_abs: float
    """|logp_old − logp_rollout|: how far the engine's logprobs are from the trainer's"""
    mismatch_k3: float
    value_loss: float | None
    value_mean: float | None
    adv_mean: float
    update: float
    epoch: float
    lr: float
    grad_norm: float
    tokens_forwarded: float
    tokens_per_s: float
    tree_token_ratio: float
    """packed tokens / root-to-leaf path tokens of the minibatch's trees"""
    tokens_saved: float
    """the whole batch's tokens packing saves over forwarding every path on its own (per epoch)"""
    trainable_tokens: float
    rollouts: float
    groups: float
    processes: float
    params: float
    params_per_rank: float
    zero_var_groups: float
    tis_seq_ratio: float
    """mean over the minibatch's rollouts of exp(Σ_t logp_old − logp_rollout)"""
    token_budget: float
    """padded tokens per micro-batch this update was planned with (less than --token-budget where memory_guard.py halved it)"""
    peak_gib: float
    """rank 0's peak memory so far, GiB: resident (VmHWM, since the caller's last peak_memory.reset) on the CPU, allocated on a GPU"""
    value_warmup_loss_first: float | None = None
    value_warmup_loss_last: float | None = None


@dataclass
class SkippedStats(_Metrics):
    """The one train.jsonl line of a batch with nothing to learn (every group flat, or no rollout above min_reward)."""

    rollouts: float
    zero_var_groups: float
    groups: float


@dataclass
class _Sums:
    """This rank's weighted sums over a minibatch's scored tokens (each weight Σ = 1 over the minibatch)."""

    loss: float = 0.0
    pg_loss: float = 0.0
    kl_ref: float = 0.0
    clip_frac: float = 0.0
    tis_clip_frac: float = 0.0
    entropy: float = 0.0
    mismatch_abs: float = 0.0
    mismatch_k3: float = 0.0
    adv_mean: float = 0.0
    tokens_forwarded: float = 0.0
    seq_ratios: list[float] = field(default_factory=list)
    """exp(Σ_t log ratio) of each rollout this rank scored"""

    def over_ranks(self, dist: Dist) -> _Sums:
        """Every rank's sums added (and their rollouts' ratios joined)."""
        names = [f.name for f in fields(self) if f.name != "seq_ratios"]
        total = dist.sum({n: getattr(self, n) for n in names})
        return _Sums(**total, seq_ratios=dist.gather_list(self.seq_ratios))


@dataclass
class _TokenTerms:
    """The per-token loss of one micro-batch and the parts its metrics are made of."""

    loss: torch.Tensor
    pg: torch.Tensor | None
    clipped: torch.Tensor
    tis_truncated: torch.Tensor
    kl: torch.Tensor | None


def _token_terms(cfg: TrainConfig, logp, logp_old, logp_rollout, adv, logp_ref, seq_index) -> _TokenTerms:
    """The loss per scored token of `cfg.algo` (module docstring), all inputs [T_step]."""
    if cfg.algo == "sft":  # cross-entropy on the kept main-role model tokens
        never = torch.zeros_like(logp, dtype=torch.bool)
        return _TokenTerms(-logp, None, never, never, None)
    pg, clipped = L.clipped_surrogate(logp, logp_old, adv, cfg.clip_low, cfg.clip_high)
    tis_w, tis_truncated = L.tis_weights(logp_old, logp_rollout, seq_index, cfg.tis, cfg.tis_cap)
    per_token = tis_w * pg
    kl = L.k3_kl(logp, logp_ref) if logp_ref is not None else None
    if kl is not None:
        per_token = per_token + cfg.kl_coef * kl
    return _TokenTerms(per_token, pg, clipped, tis_truncated, kl)


def _policy_pass(models: Models, batch: Batch, scores: Scores, advantages: list[torch.Tensor], micro: RankMicroBatches,
                 plan: RankPlan, token_weights: dict[int, torch.Tensor], cfg: TrainConfig) -> _Sums:
    """Forward and backward over this rank's micro-batches; the gradients accumulate in the policy (a shared
    prefix's too: `micro.steps` forwards it before the first step and back-propagates it after the last)."""
    sums = _Sums()
    accelerator = micro.accelerator
    for step in micro.steps(plan, models.policy):
        sums.tokens_forwarded += step.forwarded
        w = micro.token_weights(token_weights, step)
        logp_old, logp_rollout = micro.gather(scores.logp_old, step), micro.gather(batch.logp_rollout, step)
        adv = micro.gather(advantages, step)
        seq_index = micro.seq_index(step)
        with accelerator.autocast():
            logp, entropy = models.policy(step.batch, with_entropy=True)
        logp_ref = micro.gather(scores.logp_ref, step) if scores.logp_ref is not None else None
        terms = _token_terms(cfg, logp, logp_old, logp_rollout, adv, logp_ref, seq_index)
        if terms.pg is not None:
            sums.pg_loss += float((w * terms.pg).detach().sum())
        loss = (w * terms.loss).sum()
        micro.backward(step, loss)
        if step.padding:
            continue
        log_ratio = (logp_old - logp_rollout).detach()
        sums.loss += float(loss.detach().sum())
        sums.clip_frac += float((w * terms.clipped.float().detach()).sum())
        sums.tis_clip_frac += float((w * terms.tis_truncated.float().detach()).sum())
        sums.entropy += float((w * entropy.detach()).sum())
        sums.mismatch_abs += float((w * log_ratio.abs().detach()).sum())
        sums.mismatch_k3 += float((w * L.k3_kl(logp_rollout, logp_old).detach()).sum())
        sums.adv_mean += float((w * adv.detach()).sum())
        if terms.kl is not None:
            sums.kl_ref += float((w * terms.kl.detach()).sum())
        per_rollout = torch.zeros(len(step.rows), device=log_ratio.device).index_add_(0, seq_index, log_ratio)
        sums.seq_ratios += [float(x) for x in per_rollout.exp()]
    return sums


def _step_policy(models: Models, cfg: TrainConfig, accelerator) -> float:
    """Clip the accumulated gradients and step the optimizer (through the fp32 masters, if any); the gradient norm."""
    grad_norm = float(accelerator.clip_grad_norm_(models.policy.parameters(), cfg.max_grad_norm))
    if models.master is not None:
        models.master.grads_in()
    models.optimizer.step()
    if models.master is not None:
        models.master.weights_out()
        models.policy.zero_grad(set_to_none=True)
    models.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def value_update(models: Models, batch: Batch, micro: RankMicroBatches, plan: RankPlan,
                 token_weights: dict[int, torch.Tensor], cfg: TrainConfig) -> float:
    """One value-model optimizer step on this rank's micro-batches `plan`: masked ½(V − R)² under `token_weights`,
    summed over ranks."""
    total, accelerator = 0.0, micro.accelerator
    for step in micro.steps(plan, models.value):
        with accelerator.autocast():
            v = models.value(step.batch)
        loss = (micro.token_weights(token_weights, step) * L.value_loss(v, micro.gather(batch.returns, step))).sum()
        micro.backward(step, loss)
        total += float(loss.detach())
    accelerator.clip_grad_norm_(models.value.parameters(), cfg.max_grad_norm)
    models.value_optimizer.step()
    models.value_optimizer.zero_grad(set_to_none=True)
    return micro.dist.sum({"v": total})["v"]


def warm_up_value(models: Models, batch: Batch, micro: RankMicroBatches, plan: RankPlan,
                  cfg: TrainConfig) -> tuple[list[float], list[torch.Tensor]]:
    """PPO before the policy moves: a fresh value model starts at the batch's mean return (the best
    constant), then `value_warmup_steps` value-only updates over the whole batch (`plan`).
    Returns their losses and V_old per tree."""
    rows = list(range(len(batch.trees)))
    token_weights = batch.token_weights(rows, cfg.aggregation)  # Σ = 1 over the batch
    if models.fresh_value:
        mean_return = float(sum((token_weights[i] * batch.returns[i]).sum() for i in rows))
        micro.accelerator.unwrap_model(models.value).start_at(mean_return)
    losses = [value_update(models, batch, micro, plan, token_weights, cfg) for _ in range(cfg.value_warmup_steps)]
    return losses, micro.score(models.value, plan)


def _peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_memory.peak_gib()


def update(models: Models, batch: Batch, scores: Scores, advantages: list[torch.Tensor], micro: RankMicroBatches,
           rows: list[int], cfg: TrainConfig, *, number: int, epoch: int,
           warmup_losses: list[float]) -> UpdateStats:
    """Update number `number`: one policy step (and one value step) on the minibatch `rows`."""
    t0 = time.perf_counter()
    token_weights = batch.token_weights(rows, cfg.aggregation)  # Σ = 1 over the minibatch
    plan = micro.plan(rows)
    sums = _policy_pass(models, batch, scores, advantages, micro, plan, token_weights, cfg).over_ranks(micro.dist)
    grad_norm = _step_policy(models, cfg, micro.accelerator)
    value_loss = value_mean = None
    if models.value is not None:
        value_loss = value_update(models, batch, micro, plan, token_weights, cfg)
        value_mean = float(sum((token_weights[i] * scores.values[i]).sum() for i in rows))
    dt = time.perf_counter() - t0
    tokens_forwarded = int(sums.tokens_forwarded)
    trees = [batch.trees[i] for i in rows]
    return UpdateStats(
        loss=sums.loss, pg_loss=sums.pg_loss, kl_ref=sums.kl_ref if scores.logp_ref is not None else None,
        clip_frac=sums.clip_frac, tis_clip_frac=sums.tis_clip_frac, entropy=sums.entropy,
        mismatch_abs=sums.mismatch_abs, mismatch_k3=sums.mismatch_k3, value_loss=value_loss, value_mean=value_mean,
        adv_mean=sums.adv_mean, update=float(number), epoch=float(epoch), lr=cfg.lr, grad_norm=grad_norm,
        tokens_forwarded=float(tokens_forwarded), tokens_per_s=tokens_forwarded / dt if dt > 0 else math.inf,
        tree_token_ratio=sum(t.n_tokens for t in trees) / sum(t.path_tokens for t in trees),
        tokens_saved=float(batch.tokens_saved), trainable_tokens=float(sum(t.n_trainable for t in trees)),
        rollouts=float(len(rows)), groups=float(batch.selection.groups), processes=float(micro.dist.world),
        params=float(models.n_params), params_per_rank=float(models.params_per_rank),
        zero_var_groups=float(batch.selection.zero_var_groups),
        tis_seq_ratio=sum(sums.seq_ratios) / len(sums.seq_ratios),
        token_budget=float(micro.token_budget), peak_gib=_peak_gib(micro.accelerator.device),
        value_warmup_loss_first=warmup_losses[0] if warmup_losses else None,
        value_warmup_loss_last=warmup_losses[-1] if warmup_losses else None)
