"""Attention over a packed tree: per-segment SDPA on CPU, block masks for FlexAttention on CUDA.

A packed tree (packing.py) lets token i attend to token j iff j is on i's root path. Handing SDPA a
dense [L, L] mask is exact but costs L² for every tree, although a token's root path is often a
small part of the sequence: with a dense mask a long tree can cost *more* than forwarding each
path alone with causal attention (research/perf.md §5.2: 0.78× on a chain, 1.6× on a wide tree).

"Segment" attention does only the useful work. The sequence is cut into runs (maximal chains of
nodes, each the first child of the one before, so contiguous in depth-first order), and each
run's queries attend to

    the run's ancestors (a few contiguous spans of the sequence) + the run itself, causally,

with one `scaled_dot_product_attention` call per run — plain `is_causal` when the run has no
ancestors (an unbranched tree is exactly one such call), otherwise an explicit mask on blocks of at
most `QUERY_BLOCK` queries so the masked-out upper triangle stays small. Keys are slices (views)
of the layer's key/value tensors, so autograd handles the backward pass.

It plugs into transformers as the attention implementation "clawgym_tree": a `TreePlan` reaches
the attention function as the layer's mask (`attention_mask={"full_attention": plan}` skips HF's
mask building); any other mask is handed to the stock SDPA function unchanged, so the same model
still generates and scores ordinary batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

QUERY_BLOCK = 512
IMPLEMENTATION = "clawgym_tree"


@dataclass
class Block:
    """Queries [q0, q1) of one row attend to keys in `key_ranges`; the last q1 − q0 keys causally."""

    q0: int
    q1: int
    key_ranges: list[tuple[int, int]]
    mask: torch.Tensor | None  # [q1 − q0, K] bool, or None for plain causal (keys == queries)


@dataclass
class TreePlan:
    """The blocks of every row of a micro-batch (rows shorter than L are zero beyond their end)."""

    rows: list[list[Block]]
    lengths: list[int]

    def to(self, device: torch.device) -> "TreePlan":
        rows = [[Block(b.q0, b.q1, b.key_ranges, None if b.mask is None else b.mask.to(device)) for b in r] for r in self.rows]
        return TreePlan(rows, self.lengths)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def plan_blocks(node_parent: list[int], node_start: list[int], n_tokens: int) -> list[Block]:
    """Blocks of one packed tree from its node structure (nodes in depth-first order)."""
    n = len(node_parent)
    ends = node_start[1:] + [n_tokens]
    runs: list[list[int]] = []  # [first node, start, end]
    for i in range(n):
        if runs and node_parent[i] == i - 1:
            # A first child follows its parent in depth-first order: the run goes on along it, so a
            # root run covers its whole first root-to-leaf path and costs one causal SDPA call.
            runs[-1][2] = ends[i]
        else:
            runs.append([i, node_start[i], ends[i]])
    blocks: list[Block] = []
    for first, s, e in runs:
        anc, p = [], node_parent[first]
        while p >= 0:
            anc.append((node_start[p], ends[p]))
            p = node_parent[p]
        if not anc:
            blocks.append(Block(s, e, [(s, e)], None))  # a root run: ordinary causal attention
            continue
        for a in range(s, e, QUERY_BLOCK):
            b = min(a + QUERY_BLOCK, e)
            ranges = _merge(anc + [(s, b)])
            K = sum(r1 - r0 for r0, r1 in ranges)
            q = b - a
            mask = torch.ones(q, K, dtype=torch.bool)
            mask[:, K - q:] = torch.ones(q, q, dtype=torch.bool).tril()
            blocks.append(Block(a, b, ranges, mask))
    return blocks


def _gather(x: torch.Tensor, ranges: list[tuple[int, int]], n_rep: int) -> torch.Tensor:
    """Keys/values of the given spans of one row: [1, Hkv, L, D] → [1, H, K, D]."""
    parts = [x[:, :, a:b] for a, b in ranges]
    k = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    if n_rep > 1:
        B, H, K, D = k.shape
        k = k[:, :, None].expand(B, H, n_rep, K, D).reshape(B, H * n_rep, K, D)
    return k


def tree_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: segment attention for a TreePlan, stock SDPA otherwise.

    query [B, H, L, D], key/value [B, Hkv, L, D] → ([B, L, H, D], None).
    """
    if not isinstance(attention_mask, TreePlan):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    B, H, L, D = query.shape
    n_rep = H // key.shape[1]
    rows = []
    for r, (blocks, length) in enumerate(zip(attention_mask.rows, attention_mask.lengths)):
        outs = []
        for blk in blocks:
            q = query[r : r + 1, :, blk.q0 : blk.q1]
            k = _gather(key[r : r + 1], blk.key_ranges, n_rep)
            v = _gather(value[r : r + 1], blk.key_ranges, n_rep)
            outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=blk.mask, is_causal=blk.mask is None,
                                                       dropout_p=dropout, scale=scaling))
        if length < L:
            outs.append(query.new_zeros(1, H, L - length, D))
        rows.append(torch.cat(outs, dim=2))
    out = torch.cat(rows, dim=0)  # [B, H, L, D]
    return out.transpose(1, 2).contiguous(), None


def enable_tree_attention(model: torch.nn.Module) -> None:
    """Route an SDPA model's attention through `tree_attention` (no-op for other implementations)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, tree_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)  # HF still builds ordinary masks
    if model.config._attn_implementation == "sdpa":
        if "sliding_attention" in (getattr(model.config, "layer_types", None) or []):
            raise ValueError("tree attention does not support sliding-window layers")
        model.set_attn_implementation(IMPLEMENTATION)


def flex_block_mask(dense: torch.Tensor):
    """A FlexAttention BlockMask over a dense [B, 1, L, L] mask (CUDA): empty blocks are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    dense = dense[:, 0].cuda()
    B, L, _ = dense.shape

    def mask_mod(b, h, q, kv):
        return dense[b, q, kv]

    return create_block_mask(mask_mod, B, None, L, L, device=dense.device)
