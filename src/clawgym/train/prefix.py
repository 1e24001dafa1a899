"""A minibatch's shared prefix, forwarded once per optimizer step however many micro-batches follow it.

Group tries (trie.py) forward a prefix once per micro-batch: when a step's tokens exceed the token
budget, every micro-batch forwards the harness's system prompt again. Here the prefix is
forwarded once for the whole minibatch, exactly:

1. `plan` finds the prefix: the longest token chain that the largest group of the minibatch's trees
   (grouped by their first `MIN_TOKENS` tokens; usually all of them, under one system prompt)
   start with, that is an ancestor of every other token of each tree (no branch inside it) and
   that predicts none of their scored tokens (it ends at or before the first `pred_pos`, so no
   logprob or value is read inside it). Those trees lose the prefix (`strip`: position ids stay
   depths, so they start at its length) and are planned into tries and micro-batches as usual;
   the other trees are planned as before, after them. A prefix under `MIN_TOKENS` tokens, or one
   whose trees fit one micro-batch anyway (the trie shares it already), is not worth it: the
   plan is trie.py's.
2. `SharedPrefix` forwards the prefix once (same autocast, LoRA and activation checkpointing as
   the micro-batches: it goes through the same backbone), recording each attention layer's keys
   and values (attention.py), and hands the micro-batches detached copies that require grad.
3. Each micro-batch attends to those keys/values before its own (every query sees the whole
   prefix), so its backward accumulates their gradients in the copies.
4. After the last micro-batch, `SharedPrefix.backward` sends the accumulated gradients back through
   the prefix's forward in one call (torch.autograd.backward on the recorded keys/values).

Under no_grad (logp_old, the reference, V_old) the same prefix is forwarded once and nothing is
back-propagated. The value model shares it the same way.

Under data parallelism (DDP) the prefix is chosen over the whole minibatch, alike on every rank,
and forwarded once for all ranks: one rank (the owner, taking turns) forwards it and broadcasts
its keys/values; every rank's micro-batches attend to them; the ranks' gradients on them are summed
on the owner, which back-propagates them through its forward. The gradient all-reduce comes after
that (microbatches.py), so it carries the prefix's part too. Not here (`unavailable` says why, once):
FSDP on several processes (it reduce-scatters every micro-batch's gradients as they come, before the
prefix's backward; trie.py's per-micro-batch tries) and sliding-window models (the window would cut
the prefix).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from clawgym.train import trie
from clawgym.train.attention import Block, PrefixKV, TreePlan
from clawgym.train.distributed import Dist
from clawgym.train.packing import MicroBatch, PackedTree, ancestor_matrix, backbone_forward
from clawgym.train.support import sliding_window

MIN_TOKENS = 64
"""a shorter shared prefix is forwarded with each micro-batch's tries, as trie.py does"""

Planned = tuple[list[int], list[PackedTree]]


def unavailable(world: int, model_config, fsdp: bool = False) -> str | None:
    """Why a shared prefix is forwarded once per micro-batch rather than once per step here (None: it is not)."""
    if world > 1 and fsdp:
        return (f"--share-prefixes: FSDP on {world} processes, so a prompt shared across micro-batches is forwarded once "
                f"per micro-batch (once per step needs DDP or a single process)")
    if sliding_window(model_config) is not None:
        name = getattr(model_config, "model_type", None) or type(model_config).__name__
        return (f"--share-prefixes: {name} attends in a sliding window, so a prompt shared across micro-batches is "
                f"forwarded once per micro-batch")
    return None


def chain_length(tree: PackedTree) -> int:
    """The most leading tokens of `tree` that every other token descends from and that predict none of its
    scored tokens: the longest prefix this tree could share."""
    n = tree.n_tokens
    at = torch.arange(n)
    off = ((tree.position_ids != at) | (tree.prev_pos != at - 1)).nonzero()
    run = int(off[0]) if off.numel() else n  # tokens 0..run-1: one chain from the root
    length = min(run, int(tree.position_ids[run:].min())) if run < n else n  # the first branch point ends it
    if tree.pred_pos.numel():
        length = min(length, int(tree.pred_pos.min()))  # the prefix's hidden states are never read
    return min(length, n - 1)


def choose(trees: Sequence[PackedTree], rows: Sequence[int]) -> tuple[list[int], int]:
    """The trees (of `rows`) that share the minibatch's prefix, and its length; ([], 0) if none is worth sharing."""
    length = {i: chain_length(trees[i]) for i in rows}
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in rows:
        if length[i] >= MIN_TOKENS:
            groups.setdefault(tuple(trees[i].input_ids[:MIN_TOKENS].tolist()), []).append(i)
    if not groups:
        return [], 0
    group = max(groups.values(), key=len)  # the most trees: a harness's system prompt, or one group's task
    if len(group) < 2:
        return [], 0
    first = trees[group[0]].input_ids
    p = min(length[i] for i in group)
    for i in group[1:]:
        differ = (trees[i].input_ids[:p] != first[:p]).nonzero()
        if differ.numel():
            p = int(differ[0])
    return group, p  # p >= MIN_TOKENS: the group agrees on its first MIN_TOKENS tokens


def strip(tree: PackedTree, p: int) -> PackedTree:
    """`tree` without its first `p` tokens (a chain every other token descends from, `chain_length`): the
    children of its last token become roots, position ids stay depths, labels move with their tokens."""
    first = int(tree.node_index[p])  # nodes are contiguous in depth-first order: those from `first` on remain
    parents = [q - first if q >= first else -1 for q in tree.node_parent[first:]]
    leaf_ends = [e - p for e in tree.leaf_ends]
    return replace(
        tree, input_ids=tree.input_ids[p:], position_ids=tree.position_ids[p:], node_index=tree.node_index[p:] - first,
        node_parent=parents, node_start=[max(s - p, 0) for s in tree.node_start[first:]], ancestors=ancestor_matrix(parents),
        pred_pos=tree.pred_pos - p, label_pos=tree.label_pos - p, prev_pos=tree.prev_pos[p:] - p, leaf_ends=leaf_ends,
        path_tokens=tree.path_tokens - p * len(leaf_ends),
        is_chain=sum(1 for q in parents if q < 0) == 1 and len(leaf_ends) == 1, prefix=p)


def plan(trees: Sequence[PackedTree], rows: Sequence[int], token_budget: int) -> list[Planned]:
    """One process's micro-batches of `rows`: those of the trees sharing the minibatch's prefix first and
    without it, where that forwards fewer tokens than trie.py's plan."""
    return plan_ranks(trees, [list(rows)], token_budget)[0][0]


def plan_ranks(trees: Sequence[PackedTree], parts: Sequence[list[int]],
               token_budget: int) -> tuple[list[list[Planned]], torch.Tensor | None]:
    """Each rank's micro-batches of its `parts` of a minibatch, and the token ids of the prefix they continue.

    The prefix is chosen over the whole minibatch, so every rank plans the same one from the same
    `parts`; it is used where forwarding it once and each part's trees without it forwards fewer
    tokens than trie.py's plan (where it all fits one micro-batch, the trie shares it already)."""
    plain = [trie.plan(trees, part, token_budget) for part in parts]
    group, p = choose(trees, [i for part in parts for i in part])
    if not p:
        return plain, None
    shared = [plan_part(trees, part, group, p, token_budget) for part in parts]
    if p + forwarded(shared) < forwarded(plain):
        return shared, trees[group[0]].input_ids[:p]
    return plain, None


def forwarded(plans: Sequence[Sequence[Planned]]) -> int:
    """The tokens the micro-batches of `plans` forward."""
    return sum(t.n_tokens for steps in plans for _, parts in steps for t in parts)


def plan_part(trees: Sequence[PackedTree], mine: Sequence[int], group: Sequence[int], p: int,
              token_budget: int) -> list[Planned]:
    """The micro-batches of the trees `mine` (one rank's part of a minibatch) when `group` shares a `p`-token
    prefix: its members here without it, first, then the others."""
    members = set(group)
    shared_rows = [i for i in mine if i in members]
    view = list(trees)
    for i in shared_rows:
        view[i] = strip(trees[i], p)
    shared = trie.plan(view, shared_rows, token_budget) if shared_rows else []
    others = [i for i in mine if i not in members]
    return shared + (trie.plan(trees, others, token_budget) if others else [])


class SharedPrefix:
    """A prefix forwarded once: its keys/values as leaves for the micro-batches, and the backward through it.

    With `dist` of several ranks, only `owner` forwards it (and back-propagates it); the others get
    its keys/values by broadcast and send their gradients on them back (module docstring)."""

    def __init__(self, body: torch.nn.Module, ids: torch.Tensor, device: torch.device, dist: Dist | None = None,
                 owner: int = 0):
        n = int(ids.numel())
        self.dist, self.owner = (dist, owner) if dist is not None and dist.world > 1 else (None, 0)
        here = self.dist is None or self.dist.rank == owner
        self.tokens = n if here else 0  # forwarded by this process
        recorded = PrefixKV(n)
        if here:
            positions = torch.arange(n, device=device)[None]
            # One chain: a single causal block, whatever the micro-batches' attention (flex, dense) is.
            chain = TreePlan([[Block(0, n, [(0, n)], None)]], [n], positions, record=recorded)
            none = torch.zeros(0, dtype=torch.long, device=device)
            backbone_forward(body, MicroBatch(ids[None].to(device), positions, chain, none, none, n))
        layers = sorted(recorded.keys)
        keys, values = [recorded.keys[i] for i in layers], [recorded.values[i] for i in layers]
        grad = [t.requires_grad for t in keys + values]
        if self.dist is not None:  # the owner's keys/values, and which need a gradient, on every rank
            got, (layers, grad) = self.dist.broadcast_tensors(keys + values if here else None, owner, device,
                                                              (layers, grad) if here else None)
            keys, values = got[:len(layers)], got[len(layers):]
        self.recorded = recorded if here else None
        leaves = [t.detach().requires_grad_(g) for t, g in zip(keys + values, grad)]
        self.kv = PrefixKV(n, dict(zip(layers, leaves[:len(layers)])), dict(zip(layers, leaves[len(layers):])))

    def attach(self, mb: MicroBatch) -> MicroBatch:
        """A micro-batch planned after this prefix, now attending to its keys/values."""
        mb.attention_mask.prefix = self.kv
        return mb

    def backward(self) -> None:
        """Back-propagate the gradients the micro-batches left on the keys/values through the prefix's forward
        (on several ranks: their sum, on the owner)."""
        layers = sorted(self.kv.keys)
        leaves = [self.kv.keys[i] for i in layers] + [self.kv.values[i] for i in layers]
        grads = [t.grad for t in leaves]
        if self.dist is not None:
            needed = [k for k, t in enumerate(leaves) if t.requires_grad]
            summed = self.dist.reduce_tensors([grads[k] if grads[k] is not None else torch.zeros_like(leaves[k])
                                               for k in needed], self.owner) if needed else None
            grads = [None] * len(leaves)
            for k, g in zip(needed, summed or []):
                grads[k] = g
        if self.recorded is not None:
            recorded = [self.recorded.keys[i] for i in layers] + [self.recorded.values[i] for i in layers]
            pairs = [(t, g) for t, g in zip(recorded, grads) if t.requires_grad and g is not None]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self.recorded = self.kv = None  # the prefix's graph and leaves are freed with this step
