"""Decode attention that reads a batch's shared prefix once (the hf engine's `shared_attention`).

A GRPO group decodes side by side: its rollouts' prompts agree on the first few thousand tokens (the
harness's system prompt and tool schemas, the task) and differ only in what each has sampled and been
told since. The engine's batch cache holds a copy of those shared keys and values in every row, and
plain attention streams every copy on every decode step: a read that grows with rows x prompt length,
all of its copies but one the same (docs/engines.md, "Shared-prefix decode attention").

Here one decode step splits each row's keys into two parts and merges them exactly:

    shared  the first P tokens every row of the batch agrees on, read from one row's copy
            (columns [start, start + P) of row `source`); all B x heads queries of a key/value head
            against it in one matrix product, [Hkv, B*g, D] x [Hkv, D, P]
    own     each row's tokens after those P, in the batch's last R columns (R = the longest such
            tail; columns of a shorter row that belong to its shared part or to padding are masked)

    out = (e_shared @ V_shared + e_own @ V_own) / (sum e_shared + sum e_own),
          e = exp(score - m), m = the larger of the two parts' maxima,

which is softmax over the concatenated scores, so the result equals plain attention over the row's
own keys up to float rounding (the shared keys of every row are the same tokens at the same
positions under the same weights). tests/engines/test_shared_attention.py checks both the function
and the engine against plain SDPA.

How it reaches the layers: the name IMPLEMENTATION is registered in transformers'
`AttentionInterface`; the engine switches a model that runs SDPA to it and passes a `SharedPrefix`
to the model's forward as keyword `PLAN_KWARG`, which transformers hands down to every attention
call. A call without a plan (prefill, a batch that shares too little), a query longer than one token,
or a layer with its own rules (sliding window, logit soft-capping, attention sinks, dropout) goes to
transformers' own SDPA function unchanged, with one exception, `masked_gqa_prefill`: a prefill
with a padding mask under grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

IMPLEMENTATION = "clawgym_shared_decode"
PLAN_KWARG = "clawgym_shared_prefix"
MIN_SHARED = 128
"""tokens the rows must share before the split pays for its extra kernels (a step at B=2 over 128
shared tokens saves one 128-token read, about what the merge's extra small operations cost)"""


@dataclass
class SharedPrefix:
    """One decode step's split of the batch's keys: see the module docstring. Tensors are on the model's device."""

    source: int
    """the row whose copy of the shared keys/values is read"""
    start: int
    """the column where the shared part begins in row `source`"""
    length: int
    """P, tokens shared by every row"""
    own: int
    """R, the last columns holding every row's own tokens"""
    valid: Any
    """bool [B, 1, 1, R]: which of the last R columns are the row's own (not shared, not padding)"""


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every sequence in `seqs` has in common."""
    if not seqs:
        return 0
    lo, hi = min(seqs), max(seqs)  # lexicographic: what every sequence shares, the least and the greatest share
    n = min(len(lo), len(hi))
    i = 0
    while i < n and lo[i] == hi[i]:
        i += 1
    return i


def plan(mask: Any, shared: int) -> SharedPrefix | None:
    """The split for a decode step over the 2D `mask` [B, W] (this step's column included), where
    every row's first `shared` tokens agree; None where plain attention is as good."""
    import torch

    B, W = mask.shape
    if B < 2 or shared < MIN_SHARED:
        return None
    n = mask.sum(1)  # each row's tokens; a row's ones are contiguous and end at column W
    starts = W - n
    own = int((n - shared).max())
    if own <= 0 or int(n.min()) <= shared:  # every row must keep its current token in its own part
        return None
    cols = torch.arange(W - own, W, device=mask.device)
    valid = (cols[None, :] >= (starts + shared)[:, None])[:, None, None, :]
    return SharedPrefix(0, int(starts[0]), shared, own, valid)


def attend(query: Any, key: Any, value: Any, p: SharedPrefix, scaling: float) -> Any:
    """Attention of one query token per row over its shared and own keys.

    query [B, H, 1, D], key/value [B, Hkv, W, D] (H = Hkv * g, head h reads key head h // g)
    → [B, 1, H, D], as transformers' attention functions return it.
    """
    import torch

    B, H, _, D = query.shape
    Hkv, W = key.shape[1], key.shape[2]
    g = H // Hkv
    q = query.reshape(B, Hkv, g, D)
    ks = key[p.source, :, p.start:p.start + p.length]          # [Hkv, P, D]
    vs = value[p.source, :, p.start:p.start + p.length]        # [Hkv, P, Dv]
    qs = q.transpose(0, 1).reshape(Hkv, B * g, D)              # [Hkv, B*g, D]
    s1 = torch.matmul(qs, ks.transpose(-1, -2)).mul_(scaling)  # [Hkv, B*g, P]
    ko, vo = key[:, :, W - p.own:], value[:, :, W - p.own:]    # [B, Hkv, R, D]
    s2 = torch.matmul(q, ko.transpose(-1, -2)).mul_(scaling)   # [B, Hkv, g, R]
    s2 = s2.masked_fill_(~p.valid, float("-inf"))
    m1 = s1.amax(-1).view(Hkv, B, g).transpose(0, 1)           # [B, Hkv, g]
    m = torch.maximum(m1, s2.amax(-1))
    e1 = s1.view(Hkv, B, g, p.length).sub_(m.transpose(0, 1).unsqueeze(-1)).exp_().view(Hkv, B * g, p.length)
    e2 = s2.sub_(m.unsqueeze(-1)).exp_()
    z = e1.sum(-1).view(Hkv, B, g).transpose(0, 1) + e2.sum(-1)  # [B, Hkv, g]
    out = torch.matmul(e1, vs).view(Hkv, B, g, -1).transpose(0, 1) + torch.matmul(e2, vo)  # [B, Hkv, g, Dv]
    out = out / z.unsqueeze(-1)
    return out.reshape(B, 1, H, -1)


def masked_gqa_prefill(query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None) -> Any:
    """Attention of a prefill chunk under grouped-query attention with a padding mask, through torch's SDPA
    with `enable_gqa`: query [B, H, T, D], key/value [B, Hkv, W, D], mask [B, 1, T, W] → [B, T, H, D].

    transformers' SDPA function copies every key/value head g times first (`repeat_kv`) whenever a mask
    is given. The engine always gives one (rows are left-padded), and a harness call's prefill is a few
    hundred new tokens over thousands of cached ones, so that copy of the whole cache, per layer and
    per chunk, costs more than the attention itself. torch reads the shared heads in place; the result
    is the same computation (tests/engines/test_shared_attention.py)."""
    import torch

    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def shared_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: `attend` for a planned decode step, `masked_gqa_prefill` for a masked
    grouped-query prefill, stock SDPA otherwise."""
    p: SharedPrefix | None = kwargs.pop(PLAN_KWARG, None)
    special = any(kwargs.get(k) is not None for k in ("sliding_window", "softcap", "s_aux", "position_bias"))
    if (p is None and not special and not dropout and query.shape[2] > 1 and attention_mask is not None
            and key.shape[1] < query.shape[1] and key.shape[-1] == value.shape[-1] and not kwargs.get("output_attentions")):
        return masked_gqa_prefill(query, key, value, attention_mask, scaling), None
    if p is None or special or dropout or query.shape[2] != 1 or key.shape[0] != query.shape[0]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return attend(query, key, value, p, scale), None


def register() -> None:
    """Make IMPLEMENTATION known to transformers (idempotent); its masks are built as for SDPA."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, shared_decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


def enable(model: Any) -> bool:
    """Route a model that attends with SDPA through `shared_decode_attention`; False (unchanged) for any other."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    model.set_attn_implementation(IMPLEMENTATION)
    return True
