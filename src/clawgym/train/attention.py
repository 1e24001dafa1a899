"""Attention over a packed tree, for any transformers decoder: per-segment SDPA or a dense tree mask.

A packed tree (packing.py) lets token i attend to token j iff j is on i's root path. Handing SDPA a
dense [L, L] mask is exact but costs L² for every tree, although a token's root path is often a
small part of the sequence: with a dense mask a long tree can cost *more* than forwarding each
path alone with causal attention (docs/models.md, "How packed trees attend").

"Segment" attention does only the useful work. The sequence is cut into runs (maximal chains of
nodes, each the first child of the one before, so contiguous in depth-first order), and each
run's queries attend to

    the run's ancestors (a few contiguous spans of the sequence) + the run itself, causally,

with one `scaled_dot_product_attention` call per run — plain `is_causal` when the run has no
ancestors (an unbranched tree is exactly one such call), otherwise an explicit mask on blocks of at
most `QUERY_BLOCK` queries so the masked-out upper triangle stays small. Keys are slices (views)
of the layer's key/value tensors, so autograd handles the backward pass.

How it reaches the model. transformers 5 lets a name be registered in its `AttentionInterface`;
a model loaded with `attn_implementation=IMPLEMENTATION` calls `tree_attention` in every attention
layer, and the keyword arguments given to the model's forward travel down to it. The `TreePlan`
travels that way (keyword `TREE_KWARG`), never as `attention_mask`: model classes differ in what
they accept there (Qwen3 takes a dict of per-layer-type masks, Llama only a tensor). As the mask
itself the trainer passes an all-ones [B, L] padding mask, for which HF's mask builders (registered
for this implementation as plain SDPA masks) build nothing; without it, the non-monotonic position
ids of a packed tree would look like packed sequences and HF would build an unused L² mask.

"Flex" attention (the CUDA default, attention_flex.py) hands FlexAttention a mask_mod over
per-token node ids and the nodes' depth-first intervals (`FlexTree`): O(L) memory, no [L, L] mask
anywhere, and a block mask that lets the kernel skip empty blocks.

The layer's own keyword arguments are honoured, so the tree path is exact on more than plain
attention: `sliding_window` (Mistral, Gemma 2/3, Qwen2 with windows: a key more than the window
behind the query *in depth on its root path* is dropped) and `softcap` (Gemma 2's attention logit
soft-capping, which SDPA cannot do, so those layers are scored explicitly). A call without a plan
(generation, a plain causal batch) goes to transformers' own SDPA function unchanged.

A step's shared prefix (prefix.py) reaches the layers the same way. The prefix's forward carries a
`PrefixKV` to `record` into: each layer keeps its keys and values (after RoPE and any key norm, as
it attends with them). A micro-batch planned after that prefix has `prefix_len` set and the
prefix's `PrefixKV` attached: each layer puts the prefix's keys/values (of its own `layer_idx`) in
front of its own, and every query attends to all of them, the prefix being an ancestor of every
token. Key indices of a plan with a prefix are then prefix-first: row token i is key
`prefix_len + i`. Not with sliding windows (prefix.py falls back there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from clawgym.errors import UserError

from clawgym.train.attention_flex import FlexTree, flex_attend


QUERY_BLOCK = 512
IMPLEMENTATION = "clawgym_tree"
TREE_KWARG = "clawgym_tree"


@dataclass
class PrefixKV:
    """A shared prefix's keys and values per attention layer (`layer_idx`), each [1, Hkv, P, D]."""

    length: int
    keys: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def keep(self, module, key: torch.Tensor, value: torch.Tensor) -> None:
        """Record one layer's keys/values; the first call wins, so activation checkpointing's
        recompute in the backward does not replace the tensors the caller already holds."""
        i = _layer(module)
        self.keys.setdefault(i, key)
        self.values.setdefault(i, value)

    def extend(self, module, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's prefix keys/values in front of a micro-batch's own: [B, Hkv, P + L, D]."""
        i = _layer(module)
        pk, pv = self.keys[i], self.values[i]
        B = key.shape[0]
        return (torch.cat([pk.expand(B, -1, -1, -1).to(key.dtype), key], dim=2),
                torch.cat([pv.expand(B, -1, -1, -1).to(value.dtype), value], dim=2))


def _layer(module) -> int:
    i = getattr(module, "layer_idx", None)
    if i is None:
        raise UserError(f"{type(module).__name__} has no layer_idx, so a prompt shared across micro-batches cannot be "
                        f"matched to its layers: train with --no-share-prefixes")
    return int(i)


@dataclass
class Block:
    """Queries [q0, q1) of one row attend to keys in `key_ranges`; the last q1 − q0 keys causally.

    Key indices count the plan's prefix first (module docstring); without a prefix they are row indices."""

    q0: int
    q1: int
    key_ranges: list[tuple[int, int]]
    mask: torch.Tensor | None  # [q1 − q0, K] bool, or None for plain causal (keys == queries)


@dataclass
class TreePlan:
    """How the rows of a micro-batch attend: segment blocks per row, or one dense ancestor mask."""

    rows: list[list[Block]]  # per row; empty lists when `dense` is set
    lengths: list[int]  # real tokens per row (rows shorter than L are zero beyond their end)
    positions: torch.Tensor  # [B, L] long: each token's depth on its root path (sliding windows measure it)
    dense: torch.Tensor | None = None  # [B, 1, L, L] bool ancestor mask (--attention dense), else None
    flex: FlexTree | None = None  # node ids and depth-first intervals (--attention flex), else None
    prefix_len: int = 0  # tokens of a shared prefix every row continues (its keys come first: module docstring)
    prefix: PrefixKV | None = None  # that prefix's keys/values, attached before the forward
    record: PrefixKV | None = None  # the prefix's own forward: each layer keeps its keys/values here
    uses: int = field(default=0, compare=False)  # attention layers that read this plan (support.py checks it)

    def to(self, device: torch.device) -> "TreePlan":
        rows = [[Block(b.q0, b.q1, b.key_ranges, None if b.mask is None else b.mask.to(device)) for b in r] for r in self.rows]
        dense = None if self.dense is None else self.dense.to(device)
        flex = None if self.flex is None else self.flex.to(device)
        return TreePlan(rows, self.lengths, self.positions.to(device), dense, flex, self.prefix_len, self.prefix, self.record)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def plan_blocks(node_parent: list[int], node_start: list[int], n_tokens: int, prefix: int = 0) -> list[Block]:
    """Blocks of one packed tree from its node structure (nodes in depth-first order); with `prefix`,
    the tree continues a shared prefix of that many keys, which every block attends to first."""
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
        anc, p = [(0, prefix)] if prefix else [], node_parent[first]
        while p >= 0:
            anc.append((prefix + node_start[p], prefix + ends[p]))
            p = node_parent[p]
        if not anc:
            blocks.append(Block(s, e, [(s, e)], None))  # a root run: ordinary causal attention
            continue
        for a in range(s, e, QUERY_BLOCK):
            b = min(a + QUERY_BLOCK, e)
            ranges = _merge(anc + [(prefix + s, prefix + b)])
            K = sum(r1 - r0 for r0, r1 in ranges)
            q = b - a
            mask = torch.ones(q, K, dtype=torch.bool)
            mask[:, K - q:] = torch.ones(q, q, dtype=torch.bool).tril()
            blocks.append(Block(a, b, ranges, mask))
    return blocks


def _gather(x: torch.Tensor, ranges: list[tuple[int, int]], n_rep: int) -> torch.Tensor:
    """Keys/values of the given spans of one row: [1, Hkv, L, D] → [1, H, K, D]."""
    parts = [x[:, :, a:b] for a, b in ranges]
    return _repeat(parts[0] if len(parts) == 1 else torch.cat(parts, dim=2), n_rep)


def _repeat(k: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Grouped-query keys/values for every query head: [B, Hkv, K, D] → [B, Hkv·n_rep, K, D]."""
    if n_rep == 1:
        return k
    B, H, K, D = k.shape
    return k[:, :, None].expand(B, H, n_rep, K, D).reshape(B, H * n_rep, K, D)


def _attend(q, k, v, mask: torch.Tensor | None, causal: bool, scaling, softcap, dropout: float) -> torch.Tensor:
    """softmax(q kᵀ · scaling [soft-capped]) v over the allowed keys: [B, H, Q, D].

    `causal` means the queries are the last Q keys, each seeing itself and the keys before it.
    SDPA has no logit soft-capping, so a soft-capped layer is computed explicitly (fp32 softmax).
    """
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                              dropout_p=dropout, scale=scaling)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    s = torch.tanh((q @ k.transpose(-1, -2)) * scale / softcap) * softcap  # [B, H, Q, K]
    Q, K = s.shape[-2:]
    if causal and mask is None:
        mask = torch.ones(Q, K, dtype=torch.bool, device=s.device).tril(K - Q)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    p = F.dropout(torch.softmax(s.float(), dim=-1).to(q.dtype), p=dropout, training=dropout > 0)
    return p @ v


def _window(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """[..., Q, K] bool: the key lies less than `window` tokens above the query on its root path."""
    return (q_pos[..., :, None] - k_pos[..., None, :]) < window


def tree_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                   sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """transformers attention function: the tree plan's attention if one is given, stock SDPA otherwise.

    query [B, H, L, D], key/value [B, Hkv, L, D] → ([B, L, H, D], None).
    """
    plan: TreePlan | None = kwargs.pop(TREE_KWARG, None)
    n_rep = query.shape[1] // key.shape[1]
    if plan is None:
        if softcap is None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                          sliding_window=sliding_window, **kwargs)
        causal = attention_mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True)
        out = _attend(query, _repeat(key, n_rep), _repeat(value, n_rep), attention_mask, causal, scaling, softcap, dropout)
        return out.transpose(1, 2).contiguous(), None
    if kwargs.get("s_aux") is not None:  # gpt-oss's learned attention sinks: an extra softmax column per head
        # a refusal, not a stub: the support self-test turns it into the one-line error naming the architecture
        raise ValueError("attention sinks (s_aux) are not supported by tree attention")
    plan.uses += 1
    if plan.record is not None:
        plan.record.keep(module, key, value)
    if plan.prefix_len:
        if plan.prefix is None or plan.prefix.length != plan.prefix_len:
            raise ValueError("a micro-batch planned after a shared prefix got no keys/values of that prefix")
        if sliding_window is not None:
            raise ValueError("a shared prefix with sliding-window attention is not supported")
        key, value = plan.prefix.extend(module, key, value)
    if plan.flex is not None:
        out = flex_attend(plan.flex, query, key, value, scaling, sliding_window, softcap, dropout)
        return out.transpose(1, 2).contiguous(), None
    if plan.dense is not None:
        mask = plan.dense
        if sliding_window is not None:
            mask = mask & _window(plan.positions, plan.positions, sliding_window)[:, None]
        out = _attend(query, _repeat(key, n_rep), _repeat(value, n_rep), mask, False, scaling, softcap, dropout)
        return out.transpose(1, 2).contiguous(), None
    B, H, L, D = query.shape
    rows = []
    for r, (blocks, length) in enumerate(zip(plan.rows, plan.lengths)):
        outs = []
        for blk in blocks:
            mask = blk.mask
            if sliding_window is not None:
                pos = plan.positions[r]
                k_pos = torch.cat([pos[a:b] for a, b in blk.key_ranges])
                near = _window(pos[blk.q0 : blk.q1], k_pos, sliding_window)
                if not bool(near.all()):
                    if mask is None:  # causal over the run itself: keys == queries
                        mask = torch.ones_like(near).tril()
                    mask = mask & near
            q = query[r : r + 1, :, blk.q0 : blk.q1]
            k = _gather(key[r : r + 1], blk.key_ranges, n_rep)
            v = _gather(value[r : r + 1], blk.key_ranges, n_rep)
            outs.append(_attend(q, k, v, mask, mask is None, scaling, softcap, dropout))
        if length < L:
            outs.append(query.new_zeros(1, H, L - length, D))
        rows.append(torch.cat(outs, dim=2))
    out = torch.cat(rows, dim=0)  # [B, H, L, D]
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make IMPLEMENTATION known to transformers (idempotent); ordinary masks are built as for SDPA."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, tree_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


def implementation(attention: str) -> str:
    """The `attn_implementation` to load a model with for a train `--attention` mode (all go through tree_attention)."""
    register()
    return IMPLEMENTATION


def enable_tree_attention(model: torch.nn.Module) -> None:
    """Route a model's attention through `tree_attention`."""
    register()
    if model.config._attn_implementation != IMPLEMENTATION:
        model.set_attn_implementation(IMPLEMENTATION)
