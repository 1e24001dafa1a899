"""The optimizer's math as pure tensor functions (paper §2.3, §3.2.3–3.2.4; docs/models.md).

Shapes: R rollouts in a batch, T scored tokens (trainable tokens of all packed trees, each counted
once per rollout), `seq_index` [T] maps a token to its rollout 0..R-1. Every function here has a
unit test in `tests/train/test_train_losses.py` against hand-computed values.

- `grpo_advantages`: (R − mean) / (std + eps) per task–harness group; zero-variance groups flagged.
- `tis_weights`: truncated importance sampling w = min(exp(logp_old − logp_rollout), C), per token
  or per rollout ("sequence"), or off.
- `clipped_surrogate`: PPO's clipped objective with separate ε low / high, as a loss to minimize.
- `k3_kl`: the k3 estimator of KL(π‖ref) from samples of π; also used for the rollout/trainer
  mismatch KL(π_rollout‖π_old).
- `value_loss`: ½ (V − R)² per token (masking happens in the aggregation weights).
- `aggregation_weights`: per-token weights so that Σ w·loss is a token-mean or a rollout-mean over
  a whole minibatch, whatever micro-batches it is split into (exact gradient accumulation).
"""

from __future__ import annotations

import torch

from clawgym.train.config import AGGREGATIONS, TIS_MODES


def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalized advantages (paper eq. 7, population std).

    rewards [R] float, group_index [R] long in 0..G-1 → (advantages [R], zero_variance [R] bool).
    A rollout in a group whose rewards are all equal (including a group of one) gets advantage 0
    and is flagged, so the caller can leave it out and count it.
    """
    G = int(group_index.max()) + 1 if group_index.numel() else 0
    ones = torch.ones_like(rewards)
    count = torch.zeros(G, dtype=rewards.dtype).index_add_(0, group_index, ones)  # [G]
    mean = torch.zeros(G, dtype=rewards.dtype).index_add_(0, group_index, rewards) / count  # [G]
    dev = rewards - mean[group_index]  # [R]
    var = torch.zeros(G, dtype=rewards.dtype).index_add_(0, group_index, dev * dev) / count  # [G]
    std = var.sqrt()[group_index]  # [R]
    # Equal rewards can leave ~1e-17 of float noise in std; treat that as zero variance.
    zero = std <= 1e-8 * (1.0 + mean[group_index].abs())
    adv = torch.where(zero, torch.zeros_like(dev), dev / (std + eps))
    return adv, zero


def tis_weights(
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    seq_index: torch.Tensor,
    mode: str = "token",
    cap: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights correcting for π_rollout ≠ π_old (paper eq. 10).

    logp_old, logp_rollout [T], seq_index [T] → (weights [T], truncated [T] bool).
    token: w_t = min(exp(logp_old_t − logp_rollout_t), C).
    sequence: one weight per rollout, min(exp(Σ_t (logp_old_t − logp_rollout_t)), C), on every token.
    off: w = 1.
    """
    if mode not in TIS_MODES:
        raise ValueError(f"tis mode must be one of {', '.join(TIS_MODES)}, got {mode!r}")
    log_ratio = (logp_old - logp_rollout).detach()  # [T]
    if mode == "off":
        return torch.ones_like(log_ratio), torch.zeros_like(log_ratio, dtype=torch.bool)
    if mode == "sequence":
        R = int(seq_index.max()) + 1 if seq_index.numel() else 0
        log_ratio = torch.zeros(R, dtype=log_ratio.dtype, device=log_ratio.device).index_add_(0, seq_index, log_ratio)[seq_index]
    ratio = log_ratio.exp()
    return ratio.clamp(max=cap), ratio > cap


def clipped_surrogate(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped objective per token, negated to be minimized (paper eq. 2).

    logp (with grad), logp_old, advantages [T] → (loss [T], clipped [T] bool). The ratio is clipped
    to [1 − eps_low, 1 + eps_high]; `clipped` marks tokens where the clipped branch was taken, so
    their gradient is zero.
    """
    ratio = torch.exp(logp - logp_old.detach())  # [T]
    unclipped = ratio * advantages
    clipped_obj = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped_obj)
    return loss, (clipped_obj < unclipped).detach()


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(π‖ref) per token from tokens sampled by π: exp(r) − r − 1, r = logp_ref − logp.

    logp, logp_ref [T] → [T], ≥ 0, unbiased in expectation, low variance (Schulman's k3).
    """
    r = logp_ref - logp
    return torch.exp(r) - r - 1.0


def value_loss(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """Squared error of the value model against the return: ½ (V(s_t) − R)², per token.

    values, returns [T] → [T]. With γ = λ = 1 the return of every state on a trajectory is its
    terminal reward (paper eq. 8); masking is done by which tokens are scored and their weights.
    """
    return 0.5 * (values - returns) ** 2


def ppo_advantages(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """A_t = R − V(s_t) (paper eq. 8: GAE with γ = λ = 1, each trajectory on its own). [T] → [T]."""
    return returns - values.detach()


def whiten(adv: torch.Tensor, weights: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(A − mean) / std over a batch, both weighted by the aggregation weights w (Σ w = 1). [T], [T] → [T].

    PPO's advantage normalization (as in cleanrl's norm_adv): it keeps the step size independent of
    the reward scale and centres the batch, so a value model that is still off by a constant does
    not push every token the same way. A batch with no spread comes back all zeros.
    """
    mean = (weights * adv).sum()
    std = (weights * (adv - mean) ** 2).sum().sqrt()
    return (adv - mean) / std if std > eps else torch.zeros_like(adv)


def aggregation_weights(seq_index: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Weights w [T] with Σ w = 1 so that Σ w·loss aggregates a minibatch's token losses.

    token-mean: every trainable token weighs the same, 1 / T.
    rollout-mean: each rollout weighs the same; its tokens share it, 1 / (n_tokens(rollout) · R).
    Tokens are each counted once per rollout because the packed tree holds each once.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, got {mode!r}")
    T = seq_index.numel()
    if T == 0:
        return torch.zeros(0)
    if mode == "token-mean":
        return torch.full((T,), 1.0 / T)
    counts = torch.bincount(seq_index).to(torch.float32)  # [R]
    n_seqs = int((counts > 0).sum())
    return 1.0 / (counts[seq_index] * n_seqs)

