"""The LM head over scored tokens in chunks: each token's target logprob and entropy, never all logits at once.

Scoring T tokens against a vocabulary of V through autograd's own ops (`whole_score`, `--head-chunk
0`) keeps the [T, V] logits, their log-softmax, its exp and their product for the backward: at
V = 152k about 0.6 MB per tensor per token in fp32, more than the whole backbone's activations per
token. `chunked_logprobs` instead runs the head on `chunk` tokens at a time. In the forward pass each
chunk's [chunk, V] tensors are freed as soon as its two [chunk] results exist; for the backward pass
each chunk keeps only its input rows ([chunk, H]) and is recomputed there (torch's non-reentrant
activation checkpointing), so at most one chunk's vocabulary tensors are alive at any moment, in
either pass. Within a chunk `_Score` computes the logprob and entropy with a hand-written backward
that keeps log p alone and needs two more [chunk, V] buffers. The head function (projection, scaling, soft-capping) is
unchanged, so the values are those of one [T, V] pass up to fp32 summation order, and the gradients
are exact; the weight's gradient is summed over the chunks by autograd, as for any reused weight,
which costs one weight-sized gradient beside the running sum.

The cost: the head's matmul runs twice for the trainable tokens (forward, then recompute in the
backward), which is T·H·V multiply-adds more, small beside the backbone's per-token work on the
much larger number of context tokens.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from clawgym.train.config import HEAD_CHUNK as DEFAULT_CHUNK


class _Score(torch.autograd.Function):
    """Target logprob and entropy of fp32 logits [c, V], with the gradient written out by hand.

    The forward computes log p as a log-softmax does (x − max − log Σ exp(x − max)) and the entropy as
    −Σ p·log p, in the same order as `whole_score`; it keeps only log p for the backward, which
    rebuilds p from it in one more [c, V] buffer beside the gradient's instead of autograd's chain of
    saved [c, V] tensors and their gradients:
        ∂ log p_t / ∂z_j = [j = t] − p_j,    ∂H / ∂z_j = −p_j (log p_j + H).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
        with torch.autocast(logits.device.type, enabled=False):  # fp32 throughout, as the whole head
            logp_all = logits - logits.amax(-1, keepdim=True)  # [c, V]
            logp_all -= logp_all.exp().sum(-1, keepdim=True).log()  # log p
            logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [c]
            if with_entropy:
                entropy = -logp_all.exp().mul_(logp_all).sum(-1)  # [c]
            else:
                entropy = logits.new_zeros(logits.shape[0])
        ctx.save_for_backward(logp_all, targets, entropy)
        ctx.set_materialize_grads(False)  # an entropy that only feeds a metric brings no gradient: skip its terms
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor | None, g_ent: torch.Tensor | None):
        if g_logp is None and g_ent is None:
            return None, None, None
        logp_all, targets, entropy = ctx.saved_tensors
        c = logp_all.shape[0]
        g_logp = g_logp if g_logp is not None else logp_all.new_zeros(c)
        p = logp_all.exp()  # [c, V]
        if g_ent is not None:
            grad = (logp_all + entropy[:, None]).mul_(g_ent[:, None]).add_(g_logp[:, None])  # g_lp + g_H (log p + H)
            grad.mul_(p).neg_()
        else:
            grad = p.mul_(-g_logp[:, None])
        del p
        grad.scatter_add_(-1, targets[:, None], g_logp[:, None])  # + g_lp at the target
        return grad, None, None


def score_logits(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target logprob [T] and entropy [T] (or None) of fp32 logits [T, V] and target ids [T]."""
    logp, entropy = _Score.apply(logits, targets, with_entropy)
    return logp, entropy if with_entropy else None


def whole_score(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The same through autograd's own log-softmax, gather and −Σ p·log p, every [T, V] tensor kept for
    the backward: the unchunked head (`chunk` 0), which the tests and bench/train.py compare with."""
    logp_all = torch.log_softmax(logits, dim=-1)  # [T, V]
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [T]
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None  # [T]
    return logp, entropy


def chunked_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                     chunk: int = DEFAULT_CHUNK, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`score_logits(head(hidden), targets)` computed `chunk` rows at a time.

    head: hidden [n, H] → fp32 logits [n, V]; hidden [T, H]; targets [T] long → logp [T], entropy [T] or None.
    chunk <= 0 runs the head on all T rows at once through autograd's own ops (`whole_score`).
    """
    T = hidden.shape[0]
    if chunk <= 0:
        return whole_score(head(hidden), targets, with_entropy)
    if T <= chunk:
        return score_logits(head(hidden), targets, with_entropy)

    def one(h: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ent = score_logits(head(h), tgt, with_entropy)  # [c], [c]
        return logp, ent if ent is not None else logp.new_zeros(())

    # Recompute only where a gradient will flow: under no_grad (scoring) a chunk's graph is never built.
    recompute = torch.is_grad_enabled()
    logps, ents = [], []
    for a in range(0, T, chunk):
        h, tgt = hidden[a:a + chunk], targets[a:a + chunk]  # [c, H], [c]
        if recompute:
            logp, ent = checkpoint(one, h, tgt, use_reentrant=False, preserve_rng_state=False)
        else:
            logp, ent = one(h, tgt)
        logps.append(logp)
        ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)

