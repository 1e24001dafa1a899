"""FlexAttention over packed trees: a mask_mod over node ids and depth-first intervals, no [L, L] mask anywhere.

`--attention flex` (the CUDA default; attention.py routes a plan carrying a `FlexTree` here). Per
row a `FlexTree` keeps each token's node and each node's last descendant in depth-first order, so
"key node is an ancestor-or-self of the query node" is two comparisons (O(L) memory). The block
mask that lets the kernel skip empty blocks is evaluated a slab of queries at a time, never L²
at once. A micro-batch that continues a step's shared prefix (prefix.py) has `prefix` keys in
front of each row's own, which every query sees. FlexAttention has no backward pass on CPU; there
its forward runs eagerly (the tests compare it with the other paths), on CUDA it is compiled.

Queries and keys are padded to a multiple of the 128-token block before the kernel: compiled on
CUDA, FlexAttention found no kernel for a mask_mod like this one (it loads through the captured
node ids) on lengths that are not block multiples, where the generated code masks the ragged edge.
Padded queries see nothing and padded keys are seen by nothing; their outputs are cut off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


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
        # Indices past the row (block padding, see the module docstring) are clamped for the loads and masked.
        L = self.node.shape[1]
        inside = (q < L) & (kv < L)
        q, kv = q.clamp_max(L - 1), kv.clamp_max(L - 1)
        nq, nk = self.node[b, q], self.node[b, kv]
        ok = inside & (kv <= q) & (nk <= nq) & (nq <= self.last[b, nk])
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


def padded(n: int) -> int:
    """`n` rounded up to a whole number of blocks: the query and key lengths the kernel is given."""
    return -(-n // FLEX_BLOCK) * FLEX_BLOCK


def _tree_block_mask(tree: FlexTree, window: int | None):
    """Which [FLEX_BLOCK × FLEX_BLOCK] blocks are empty, partial or full, evaluated a slab of queries at a time."""
    from torch.nn.attention.flex_attention import BlockMask

    B, L = tree.node.shape
    nb, nbk = padded(L) // FLEX_BLOCK, padded(tree.prefix + L) // FLEX_BLOCK  # keys: the prefix's, then the row's own
    dev = tree.node.device
    partial = torch.zeros(B, nb, nbk, dtype=torch.bool, device=dev)
    full = torch.zeros(B, nb, nbk, dtype=torch.bool, device=dev)
    kv = torch.arange(nbk * FLEX_BLOCK, device=dev)
    for b in range(B):
        for q0 in range(0, L, _Q_CHUNK):
            q1 = min(q0 + _Q_CHUNK, L)
            q = torch.arange(q0, q1, device=dev)
            k1 = tree.prefix + q1
            m = tree.allowed(b, q[:, None], kv[None, :k1], window)  # [q, k1]: keys after the last query are masked
            nq = padded(q.numel()) // FLEX_BLOCK
            # Padding queries/keys count as masked, so a ragged last block is never taken as full.
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
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, FLEX_BLOCK, mask_mod,
                                    seq_lengths=(nb * FLEX_BLOCK, nbk * FLEX_BLOCK))


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


def flex_attend(tree: FlexTree, query, key, value, scaling, sliding_window, softcap, dropout) -> torch.Tensor:
    """Tree attention through FlexAttention with the tree's block mask: [B, H, L, D]."""
    if dropout > 0:
        raise ValueError("attention dropout is not supported by FlexAttention tree attention")
    score_mod = None
    if softcap is not None:
        def score_mod(score, b, h, q, kv):
            return torch.tanh(score / softcap) * softcap
    L, K = query.shape[2], key.shape[2]
    grow_q, grow_k = padded(L) - L, padded(K) - K  # block padding (module docstring); [B, H, L, D] grows along L
    if grow_q:
        query = F.pad(query, (0, 0, 0, grow_q))
    if grow_k:
        key, value = F.pad(key, (0, 0, 0, grow_k)), F.pad(value, (0, 0, 0, grow_k))
    out = _flex(query, key, value, score_mod=score_mod, block_mask=tree.block_mask(sliding_window), scale=scaling,
                enable_gqa=key.shape[1] != query.shape[1])
    return out[:, :, :L] if grow_q else out


def flex_block_mask(dense: torch.Tensor):
    """A FlexAttention BlockMask over a dense [B, 1, L, L] mask: the L² baseline bench/train.py compares against."""
    from torch.nn.attention.flex_attention import create_block_mask

    dense = dense[:, 0]
    B, L, _ = dense.shape

    def mask_mod(b, h, q, kv):
        return dense[b, q, kv]

    return create_block_mask(mask_mod, B, None, L, L, device=dense.device)
