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

"Flex" attention (the CUDA default) hands FlexAttention a mask_mod over per-token node ids and
the nodes' depth-first intervals (`FlexTree`): O(L) memory, no [L, L] mask anywhere, and a block
mask that lets the kernel skip empty blocks. FlexAttention has no backward pass on CPU; there its
forward runs eagerly (the tests compare it with the other paths), on CUDA it is compiled.

The layer's own keyword arguments are honoured, so the tree path is exact on more than plain
attention: `sliding_window` (Mistral, Gemma 2/3, Qwen2 with windows: a key more than the window
behind the query *in depth on its root path* is dropped) and `softcap` (Gemma 2's attention logit
soft-capping, which SDPA cannot do, so those layers are scored explicitly). A call without a plan
(generation, a plain causal batch) goes to transformers' own SDPA function unchanged.

A step's shared prefix (prefix.py) reaches the layers the same way. The prefix's forward carries a
`PrefixKV` (prefix.py) to `record` into: each layer keeps its keys and values (after RoPE and any
key norm, as it attends with them). A micro-batch planned after that prefix has `prefix_len` set and the prefix's
`PrefixKV` attached: each layer puts the prefix's keys/values (of its own `layer_idx`) in front of
its own, and every query attends to all of them, the prefix being an ancestor of every token.
Key indices of a plan with a prefix are then prefix-first: row token i is key `prefix_len + i`.
Not with sliding windows (prefix.py falls back there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from clawgym.train.prefix import PrefixKV

QUERY_BLOCK = 512
IMPLEMENTATION = "clawgym_tree"
TREE_KWARG = "clawgym_tree"


@dataclass
class Block:
    """Queries [q0, q1) of one row attend to keys in `key_ranges`; the last q1 − q0 keys causally.

    Key indices count the plan's prefix first (module docstring); without a prefix they are row indices."""

    q0: int
    q1: int
    key_ranges: list[tuple[int, int]]
    mask: torch.Tensor | None  # [q1 − q0, K] bool, or None for plain causal (keys == queries)


@dataclass
class FlexTree:
    """A micro-batch's tree structure for FlexAttention in O(L) memory: no [L, L] mask is ever built.

    Nodes are numbered in depth-first (pre-order) order per row, so a node's subtree is the index
    interval [node, last[node]]; node j is an ancestor-or-self of node i iff j <= i <= last[j]
    (its entry index precedes i's and its exit index follows i's). Token q may attend to token kv
    iff kv <= q in sequence order and kv's node is an ancestor-or-self of q's node; within one node
    that is plain causality. Padding tokens form one extra node per row that nothing else reaches.
    """

    node: torch.Tensor  # [B, L] long: each token's node
    last: torch.Tensor  # [B, N] long: the last node (pre-order index) in each node's subtree
    positions: torch.Tensor  # [B, L] long: depth on the root path (sliding windows measure it)
    prefix: int = 0  # keys of a shared prefix in front of every row's own (kv index P + i is row token i)
    masks: dict = field(default_factory=dict, compare=False)  # sliding window (or None) → BlockMask, built once

    def to(self, device: torch.device) -> "FlexTree":
        return FlexTree(self.node.to(device), self.last.to(device), self.positions.to(device), self.prefix)

    def allowed(self, b, q, kv, window: int | None = None):
        """The mask_mod's rule, on index tensors that broadcast (one batch row b): q a row token, kv a key."""
        if self.prefix:  # every query sees the whole prefix, then its own tree
            k = (kv - self.prefix).clamp_min(0)
            return (kv < self.prefix) | self._allowed(b, q, k, window)
        return self._allowed(b, q, kv, window)

    def _allowed(self, b, q, kv, window):
        nq, nk = self.node[b, q], self.node[b, kv]
        ok = (kv <= q) & (nk <= nq) & (nq <= self.last[b, nk])
        if window is not None:
            ok = ok & (self.positions[b, q] - self.positions[b, kv] < window)
        return ok

    def block_mask(self, window: int | None = None):
        """The FlexAttention BlockMask for one window (None: full attention), cached per window."""
        if window not in self.masks:
            self.masks[window] = _tree_block_mask(self, window)
        return self.masks[window]


def flex_tree(nodes: list[tuple[torch.Tensor, list[int]]], positions: torch.Tensor, prefix: int = 0) -> FlexTree:
    """A FlexTree over rows given as (token → node index [n], node parents in pre-order); positions [B, L];
    `prefix` keys of a shared prefix in front of each row."""
    (B, length), N = positions.shape, max(len(parents) for _, parents in nodes) + 1
    node = torch.zeros(B, length, dtype=torch.long)
    last = torch.zeros(B, N, dtype=torch.long)
    for b, (node_index, parents) in enumerate(nodes):
        n = len(parents)
        end = list(range(n))
        for i in range(n - 1, -1, -1):  # children follow their parent in pre-order: fold each subtree's end upwards
            if parents[i] >= 0:
                end[parents[i]] = max(end[parents[i]], end[i])
        last[b, :n] = torch.tensor(end, dtype=torch.long)
        last[b, n:] = torch.arange(n, N)  # the padding node (and unused slots) reach only themselves
        node[b, : node_index.numel()] = node_index
        node[b, node_index.numel():] = n
    return FlexTree(node, last, positions, prefix)


FLEX_BLOCK = 128  # FlexAttention's default sparse block size
_Q_CHUNK = 1024  # queries evaluated at once when the block mask is built: memory O(_Q_CHUNK · L), never L²


def _tree_block_mask(tree: FlexTree, window: int | None):
    """Which [FLEX_BLOCK × FLEX_BLOCK] blocks are empty, partial or full, evaluated a slab of queries at a time."""
    from torch.nn.attention.flex_attention import BlockMask

    B, L = tree.node.shape
    K = tree.prefix + L  # keys: the prefix's, then the row's own
    nb, nbk = -(-L // FLEX_BLOCK), -(-K // FLEX_BLOCK)
    dev = tree.node.device
    partial = torch.zeros(B, nb, nbk, dtype=torch.bool, device=dev)
    full = torch.zeros(B, nb, nbk, dtype=torch.bool, device=dev)
    kv = torch.arange(K, device=dev)
    for b in range(B):
        for q0 in range(0, L, _Q_CHUNK):
            q1 = min(q0 + _Q_CHUNK, L)
            q = torch.arange(q0, q1, device=dev)
            k1 = tree.prefix + q1
            m = tree.allowed(b, q[:, None], kv[None, :k1], window)  # [q, k1]: keys after the last query are masked
            nq = -(-q.numel() // FLEX_BLOCK)
            # Out-of-range queries/keys count as masked, so a ragged last block is never taken as full.
            m = F.pad(m, (0, nbk * FLEX_BLOCK - k1, 0, nq * FLEX_BLOCK - q.numel())).view(nq, FLEX_BLOCK, nbk, FLEX_BLOCK)
            some, every = m.any(3).any(1), m.all(3).all(1)
            qb = q0 // FLEX_BLOCK
            partial[b, qb : qb + nq] = some & ~every
            full[b, qb : qb + nq] = every

    def ordered(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [B, 1, nb] counts and [B, 1, nb, nb] block indices, the selected ones first (BlockMask's layout)
        idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
        return sel.sum(-1, dtype=torch.int32)[:, None], idx.to(torch.int32)[:, None]

    def mask_mod(b, h, q, kv):
        return tree.allowed(b, q, kv, window)

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, FLEX_BLOCK, mask_mod, seq_lengths=(L, K))


_compiled_flex = None


def _flex(q, k, v, **kw):
    """flex_attention: compiled on CUDA (the fused kernel), eager elsewhere (CPU: exact, forward only)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type != "cuda":
        return flex_attention(q, k, v, **kw)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex(q, k, v, **kw)


def _flex_attend(tree: FlexTree, query, key, value, scaling, sliding_window, softcap, dropout) -> torch.Tensor:
    """Tree attention through FlexAttention with the tree's block mask: [B, H, L, D]."""
    if dropout > 0:
        raise ValueError("attention dropout is not supported by FlexAttention tree attention")
    score_mod = None
    if softcap is not None:
        def score_mod(score, b, h, q, kv):
            return torch.tanh(score / softcap) * softcap
    return _flex(query, key, value, score_mod=score_mod, block_mask=tree.block_mask(sliding_window), scale=scaling,
                 enable_gqa=key.shape[1] != query.shape[1])


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
        out = _flex_attend(plan.flex, query, key, value, scaling, sliding_window, softcap, dropout)
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


def flex_block_mask(dense: torch.Tensor):
    """A FlexAttention BlockMask over a dense [B, 1, L, L] mask: the L² baseline bench/train.py compares against."""
    from torch.nn.attention.flex_attention import create_block_mask

    dense = dense[:, 0]
    B, L, _ = dense.shape

    def mask_mod(b, h, q, kv):
        return dense[b, q, kv]

    return create_block_mask(mask_mod, B, None, L, L, device=dense.device)
