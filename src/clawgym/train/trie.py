"""Group tries: the trees of rollouts that share a prefix, packed into one trie so the prefix is forwarded once.

The rollouts of a GRPO group (and often all rollouts of one harness) start with the same system
prompt and task. Packed one tree per rollout, every tree forwards that prefix again. A trie merges
the trees token by token: two tokens become one when they have the same id and their predecessors
on the root path are already one token. A merged token has the same root path, at the same depth,
as in every tree it came from, so its hidden state is unchanged and the trie is exact.

Losses stay per rollout. Each scored token keeps its own label entry, with its `pred_pos` mapped
into the trie: a token two rollouts share is predicted from one position but scored once for each
rollout (with that rollout's advantage and logprobs), exactly as in the separate trees; shared
prefixes are prompt tokens, which carry no loss anyway. The trie's labels are its members' labels
concatenated in member order, so the trainer's per-rollout token arrays line up unchanged.

`microbatches` is what the trainer calls: the chosen trees, grouped into tries within the token
budget (trees with a common prefix side by side), then into padded micro-batches (packing.py).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from clawgym.train.packing import MicroBatch, PackedTree, ancestor_matrix, collate, plan_microbatches


class _Trie:
    """Token-level trie: (parent trie token or -1, token id) → trie token, in insertion order."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, int], int] = {}
        self.token: list[int] = []
        self.parent: list[int] = []
        self.depth: list[int] = []  # position id (depth on the root path): a tree continuing a shared prefix starts past it

    def new_tokens(self, tree: PackedTree) -> int:
        """How many tokens inserting `tree` would add (the trie is left as it is)."""
        ids, prev = tree.input_ids.tolist(), tree.prev_pos.tolist()
        at: list[int] = [-1] * len(ids)  # -1: not in the trie, so neither is anything below it
        added = 0
        for p in range(len(ids)):  # depth-first order: a token's predecessor comes before it
            q = prev[p]
            j = -1 if q >= 0 and at[q] < 0 else self.index.get((at[q] if q >= 0 else -1, ids[p]), -1)
            at[p] = j
            added += j < 0
        return added

    def insert(self, tree: PackedTree) -> torch.Tensor:
        """Add a tree; [N] long: the trie token of each of its positions."""
        ids, prev, depth = tree.input_ids.tolist(), tree.prev_pos.tolist(), tree.position_ids.tolist()
        at = [0] * len(ids)
        for p in range(len(ids)):
            key = (at[prev[p]] if prev[p] >= 0 else -1, ids[p])
            j = self.index.get(key)
            if j is None:
                j = self.index[key] = len(self.token)
                self.token.append(ids[p])
                self.parent.append(key[0])
                self.depth.append(depth[p])
            at[p] = j
        return torch.tensor(at, dtype=torch.long)


def merge_trees(trees: Sequence[PackedTree]) -> PackedTree:
    """One packed trie holding every tree; its labels are the trees' labels in order."""
    if len({t.prefix for t in trees}) > 1:
        raise ValueError("cannot merge trees that continue different shared prefixes")
    trie = _Trie()
    maps = [trie.insert(t) for t in trees]
    n = len(trie.token)
    kids: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for j, p in enumerate(trie.parent):
        (kids[p] if p >= 0 else roots).append(j)
    # Lay the trie out depth-first; a node is a maximal chain of tokens, each the only child of the one before.
    new_pos = [0] * n
    ids, pos, prev, node_of, node_parent, node_start, leaf_ends = [], [], [], [], [], [], []
    stack = [(r, -1) for r in reversed(roots)]  # (first trie token of a node, parent node)
    while stack:
        j, parent_node = stack.pop()
        idx = len(node_parent)
        node_parent.append(parent_node)
        node_start.append(len(ids))
        while True:
            p = trie.parent[j]
            new_pos[j] = len(ids)
            ids.append(trie.token[j])
            prev.append(new_pos[p] if p >= 0 else -1)
            pos.append(trie.depth[j])
            node_of.append(idx)
            if len(kids[j]) != 1:
                break
            j = kids[j][0]
        if not kids[j]:
            leaf_ends.append(len(ids) - 1)
        stack.extend((c, idx) for c in reversed(kids[j]))
    where = torch.tensor(new_pos, dtype=torch.long)
    cat = torch.cat
    return PackedTree(
        rollout_id="+".join(t.rollout_id for t in trees),
        input_ids=torch.tensor(ids, dtype=torch.long),
        position_ids=torch.tensor(pos, dtype=torch.long),
        node_index=torch.tensor(node_of, dtype=torch.long),
        node_parent=node_parent,
        node_start=node_start,
        ancestors=ancestor_matrix(node_parent),
        pred_pos=cat([where[m[t.pred_pos]] for t, m in zip(trees, maps)]),
        label_pos=cat([where[m[t.label_pos]] for t, m in zip(trees, maps)]),
        target_ids=cat([t.target_ids for t in trees]),
        trainable=cat([t.trainable for t in trees]),
        rollout_logprobs=cat([t.rollout_logprobs for t in trees]),
        prev_pos=torch.tensor(prev, dtype=torch.long),
        leaf_ends=leaf_ends,
        path_tokens=sum(t.path_tokens for t in trees),
        is_chain=sum(1 for p in node_parent if p < 0) == 1 and len(leaf_ends) == 1,
        prefix=trees[0].prefix,
    )


def plan_tries(trees: Sequence[PackedTree], rows: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group trees into tries of at most `token_budget` tokens (a tree longer than that stays alone).

    Trees are visited in token order, so trees with a common prefix (a GRPO group, one harness's
    system prompt) sit next to each other and a trie takes them while its size stays in budget.
    """
    order = sorted(rows, key=lambda i: trees[i].input_ids.tolist())
    groups: list[list[int]] = []
    trie, size = _Trie(), 0
    for i in order:
        add = trie.new_tokens(trees[i])
        if not groups or size + add > token_budget:
            groups.append([])
            trie, size, add = _Trie(), 0, trees[i].n_tokens
        groups[-1].append(i)
        trie.insert(trees[i])
        size += add
    return groups


def plan(trees: Sequence[PackedTree], rows: Sequence[int], token_budget: int,
         share_prefixes: bool = True) -> list[tuple[list[int], list[PackedTree]]]:
    """The given trees' micro-batches, not yet collated: (the trees' indices in label order, the packed
    trees or tries to collate). With `share_prefixes`, trees sharing a prefix are merged into tries
    first; a micro-batch's scored tokens are then those of the listed trees, one after the other."""
    rows = list(rows)
    units = plan_tries(trees, rows, token_budget) if share_prefixes else [[i] for i in rows]
    packed = [trees[u[0]] if len(u) == 1 else merge_trees([trees[i] for i in u]) for u in units]
    return [([i for u in picked for i in units[u]], [packed[u] for u in picked])
            for picked in plan_microbatches([p.n_tokens for p in packed], token_budget)]


def microbatches(trees: Sequence[PackedTree], rows: Sequence[int], token_budget: int, attention: str,
                 share_prefixes: bool = True) -> Iterator[tuple[list[int], MicroBatch]]:
    """`plan`'s micro-batches collated one at a time: (the trees' indices in label order, the micro-batch)."""
    for picked, parts in plan(trees, rows, token_budget, share_prefixes):
        yield picked, collate(parts, range(len(parts)), attention=attention)
