"""The LM head over scored tokens in chunks: each token's target logprob and entropy, never all logits at once.

Scoring T tokens against a vocabulary of V needs the [T, V] logits, their log-softmax and (for the
entropy) its exp: at V = 152k that is about 0.6 MB per tensor per token in fp32, more than the
whole backbone's activations per token. `chunked_logprobs` instead runs the head on `chunk` tokens
at a time. In the forward pass each chunk's [chunk, V] tensors are freed as soon as its two [chunk]
results exist; for the backward pass each chunk keeps only its input rows ([chunk, H]) and is
recomputed there (torch's non-reentrant activation checkpointing), so at most one chunk's vocabulary
tensors are alive at any moment, in either pass. The head function itself is unchanged, so the
values are those of one [T, V] pass (row-wise operations on the same rows) and the gradients are
exact; the weight's gradient is summed over the chunks by autograd, as for any reused weight.

The cost: the head's matmul runs twice for the trainable tokens (forward, then recompute in the
backward), which is T·H·V multiply-adds more, small beside the backbone's per-token work on the
much larger number of context tokens.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK = 512  # tokens per chunk: [512, V] fp32 is 100 MB at V = 49k, 311 MB at 152k


def score_logits(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target logprob [T] and entropy [T] (or None) of fp32 logits [T, V] and target ids [T]."""
    logp_all = torch.log_softmax(logits, dim=-1)  # [T, V]
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)  # [T]
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None  # [T]
    return logp, entropy


def chunked_logprobs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                     chunk: int = DEFAULT_CHUNK, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`score_logits(head(hidden), targets)` computed `chunk` rows at a time.

    head: hidden [n, H] → fp32 logits [n, V]; hidden [T, H]; targets [T] long → logp [T], entropy [T] or None.
    chunk <= 0 runs the head on all T rows at once (the unchunked reference).
    """
    T = hidden.shape[0]
    if chunk <= 0 or T <= chunk:
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

