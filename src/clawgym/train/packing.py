"""Tree packing: one rollout's prefix tree → one sequence whose forward pass equals every path's.

A rollout's tree (rows of `trees.parquet`, docs/architecture.md) is flattened depth-first into one token
sequence. Attention is restricted so that a token sees only the tokens on its own root path, and
its position id is its depth on that path; then every token's hidden state is exactly what it would
be in a forward pass over its root-to-leaf path alone (docs/models.md: equal to ~2e-7 in fp32).

Labels cannot come from shifting `input_ids` by one, because a branch point has several children.
Instead every target token carries `pred_pos`, the position whose output predicts it: the previous
token inside its node, or the parent node's last token for a node's first token. A branch point's
last token therefore predicts once per child, and each token of the tree is scored exactly once —
which is the paper's "shared prefixes count once per rollout" (§3.2.3) with no extra weighting.

Only the part of the tree that training needs is packed: the trainable nodes (kept, model, main)
and their ancestors. Dead leaves, subagent and compaction branches are never forwarded.

`collate` turns several packed trees into a padded micro-batch with one of three attention
structures: a segment plan (attention.py: per-run SDPA, the CPU default, no L² work), a dense
boolean ancestor mask [B, 1, L, L], or per-token node ids for a FlexAttention mask_mod (the CUDA
default, O(L) memory), each carried by a TreePlan so sliding windows and soft-capping apply; one
unbranched tree gets no mask at all (plain causal attention). Trees that continue a step's shared
prefix (prefix.py) get a plan whose keys start with that prefix's. `backbone_forward` hands a
micro-batch to any transformers decoder (attention.py says how).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

import torch

from clawgym.artifacts import TreeNode
from clawgym.errors import UserError
from clawgym.train.attention import TREE_KWARG, TreePlan, enable_tree_attention, plan_blocks
from clawgym.train.attention_flex import flex_tree
from clawgym.train.config import ATTENTIONS
from clawgym.train.lm_head import DEFAULT_CHUNK, chunked_logprobs
from clawgym.trees import training_nodes


@dataclass
class PackedTree:
    """One rollout's tree as a sequence plus one label per scored token."""

    rollout_id: str
    input_ids: torch.Tensor  # [N] long, tokens in depth-first order
    position_ids: torch.Tensor  # [N] long, depth of each token on its own root path
    node_index: torch.Tensor  # [N] long, which packed node each token belongs to
    node_parent: list[int]  # packed index of each node's parent (-1 for a root), depth-first order
    node_start: list[int]  # position of each node's first token
    ancestors: torch.Tensor  # [n_nodes, n_nodes] bool, ancestors[i, j]: node j is node i or above it
    pred_pos: torch.Tensor  # [T] long, position whose output predicts each scored token
    label_pos: torch.Tensor  # [T] long, position of each scored token
    target_ids: torch.Tensor  # [T] long, the scored tokens
    trainable: torch.Tensor  # [T] bool, scored token is a trainable model token
    rollout_logprobs: torch.Tensor  # [T] float, the engine's logprob (0 for env tokens)
    prev_pos: torch.Tensor  # [N] long, each token's predecessor on its root path (-1 for a root's first token)
    leaf_ends: list[int]  # position of the last token of each leaf node
    path_tokens: int  # Σ over root-to-leaf paths of their length: what per-trajectory packing forwards
    is_chain: bool  # one root, no branching: plain causal attention suffices
    prefix: int = 0  # tokens of a step's shared prefix this tree continues, forwarded apart (prefix.py); 0: a whole tree

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def leaves(self) -> int:
        return len(self.leaf_ends)

    @property
    def n_trainable(self) -> int:
        return int(self.trainable.sum())

    def attention_mask(self) -> torch.Tensor:
        """[N, N] bool: token i may attend to token j iff j is on i's root path at or before i."""
        m = self.ancestors[self.node_index][:, self.node_index]
        return m & torch.ones_like(m).tril()


def _children(nodes: Sequence[TreeNode], rollout_id: str) -> tuple[dict[int, TreeNode], dict[int, list[int]]]:
    by_id: dict[int, TreeNode] = {}
    for n in nodes:
        if n.node_id in by_id:
            raise UserError(f"rollout {rollout_id} has node_id {n.node_id} twice")
        by_id[n.node_id] = n
    children: dict[int, list[int]] = defaultdict(list)
    for n in nodes:
        if n.parent_id != -1 and n.parent_id not in by_id:
            raise UserError(f"rollout {rollout_id} node {n.node_id} has parent_id {n.parent_id}, which is not in the tree")
        children[n.parent_id].append(n.node_id)
    for kids in children.values():
        kids.sort()
    return by_id, children


def ancestor_matrix(node_parent: list[int]) -> torch.Tensor:
    """[n, n] bool, [i, j]: node j is node i or above it (nodes in depth-first order, parent −1 for a root)."""
    n = len(node_parent)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(node_parent):
        anc[i, i] = True
        if p >= 0:
            anc[i] |= anc[p]  # parents precede children, so the parent's row is complete
    return anc


def pack_tree(nodes: Sequence[TreeNode], *, only_trainable: bool = True) -> PackedTree:
    """Flatten one rollout's nodes depth-first.

    With `only_trainable` (training), only trainable nodes and their ancestors are packed and only
    trainable tokens are scored; without it (tests, diagnostics) the whole tree is packed and every
    token that has a predecessor is scored.
    """
    if not nodes:
        raise UserError("empty rollout")
    rollout_id = nodes[0].rollout_id
    by_id, children = _children(nodes, rollout_id)

    roots = children.get(-1, [])
    if not roots:
        raise UserError(f"rollout {rollout_id} has no root node (parent_id -1)")
    # Which nodes to pack: with only_trainable, the trainable ones and their ancestors (trees.training_nodes).
    keep = {n.node_id for n in training_nodes(nodes)}.__contains__ if only_trainable else (lambda nid: True)

    ids, pos, prev_pos, node_of, parents_of_node, node_start = [], [], [], [], [], []
    pred, label, tgt, trn, rlp = [], [], [], [], []
    leaf_ends: list[int] = []
    # Depth-first pre-order: a node's ancestors always come before it in the sequence.
    stack: list[tuple[int, int, int]] = [(r, -1, -1) for r in reversed(roots) if keep(r)]  # (node, parent packed idx, parent last pos)
    while stack:
        nid, parent_idx, parent_last = stack.pop()
        node = by_id[nid]
        if not node.token_ids:
            raise UserError(f"rollout {rollout_id} node {nid} has no tokens")
        is_model = node.kind == "model"
        if is_model and len(node.logprobs) != len(node.token_ids):
            raise UserError(
                f"rollout {rollout_id} node {nid} field 'logprobs' has {len(node.logprobs)} values for {len(node.token_ids)} tokens"
            )
        depth0 = 0 if parent_idx < 0 else int(pos[parent_last]) + 1
        if node.depth != depth0:
            raise UserError(f"rollout {rollout_id} node {nid} field 'depth' is {node.depth}, its root path puts it at {depth0}")
        idx, start, n = len(parents_of_node), len(ids), len(node.token_ids)
        parents_of_node.append(parent_idx)
        node_start.append(start)
        ids.extend(node.token_ids)
        pos.extend(range(depth0, depth0 + n))
        node_of.extend([idx] * n)
        prev_pos.append(parent_last)  # a node's first token continues from its parent's last token
        prev_pos.extend(range(start, start + n - 1))
        if node.trainable or not only_trainable:
            first = 0 if parent_last >= 0 else 1  # a root's first token has nothing to predict it
            label.extend(range(start + first, start + n))
            pred.extend(prev_pos[start + first:])
            tgt.extend(node.token_ids[first:])
            trn.extend([node.trainable] * (n - first))
            rlp.extend(node.logprobs[first:] if is_model else [0.0] * (n - first))
        last = len(ids) - 1
        kids = [c for c in children.get(nid, ()) if keep(c)]
        if not kids:
            leaf_ends.append(last)
        for c in reversed(kids):
            stack.append((c, idx, last))

    anc = ancestor_matrix(parents_of_node)
    n_roots = sum(1 for p in parents_of_node if p < 0)
    return PackedTree(
        rollout_id=rollout_id,
        input_ids=torch.tensor(ids, dtype=torch.long),
        position_ids=torch.tensor(pos, dtype=torch.long),
        node_index=torch.tensor(node_of, dtype=torch.long),
        node_parent=parents_of_node,
        node_start=node_start,
        ancestors=anc,
        pred_pos=torch.tensor(pred, dtype=torch.long),
        label_pos=torch.tensor(label, dtype=torch.long),
        target_ids=torch.tensor(tgt, dtype=torch.long),
        trainable=torch.tensor(trn, dtype=torch.bool),
        rollout_logprobs=torch.tensor(rlp, dtype=torch.float32),
        prev_pos=torch.tensor(prev_pos, dtype=torch.long),
        leaf_ends=leaf_ends,
        path_tokens=sum(pos[e] + 1 for e in leaf_ends),
        is_chain=n_roots == 1 and len(leaf_ends) == 1,
    )


def root_paths(tree: PackedTree) -> list[torch.Tensor]:
    """Positions (in the packed sequence) of every root-to-leaf path: the per-trajectory baseline."""
    prev = tree.prev_pos.tolist()
    paths = []
    for end in tree.leaf_ends:
        p, path = end, []
        while p >= 0:
            path.append(p)
            p = prev[p]
        paths.append(torch.tensor(path[::-1], dtype=torch.long))
    return paths


@dataclass
class MicroBatch:
    """Several packed trees padded to one length, with their scored tokens in row order."""

    input_ids: torch.Tensor  # [B, L] long
    position_ids: torch.Tensor  # [B, L] long
    attention_mask: TreePlan | None  # a TreePlan (segments, dense or flex), or None (plain causal)
    pred_index: torch.Tensor  # [T] long, flat index into B*L of the position predicting each scored token
    target_ids: torch.Tensor  # [T] long
    n_tokens: int  # real (unpadded) tokens forwarded

    def to(self, device: torch.device) -> "MicroBatch":
        mask = self.attention_mask.to(device) if isinstance(self.attention_mask, TreePlan) else self.attention_mask
        return MicroBatch(self.input_ids.to(device), self.position_ids.to(device), mask,
                          self.pred_index.to(device), self.target_ids.to(device), self.n_tokens)


def plan_microbatches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group items into micro-batches whose padded size (rows × longest) stays within the budget.

    Longest first, so each micro-batch pads to its first item; an item longer than the budget goes
    alone (a tree is never split).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def collate(trees: Sequence[PackedTree], rows: Sequence[int], *, attention: str = "segments") -> MicroBatch:
    """Pad the chosen trees into one micro-batch with the attention structure that keeps them exact.

    attention: "segments" (a TreePlan of blocks for `attention.tree_attention`, the CPU default),
    "dense" (a TreePlan carrying a [B, 1, L, L] boolean ancestor mask), or "flex" (a TreePlan carrying
    per-token node ids and depth-first intervals for a FlexAttention mask_mod: O(L) memory, no [L, L]
    mask). One unbranched tree alone gets no mask at all: plain causal attention.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    picked = [trees[i] for i in rows]
    B, L = len(picked), max(t.n_tokens for t in picked)
    input_ids = torch.zeros(B, L, dtype=torch.long)
    position_ids = torch.zeros(B, L, dtype=torch.long)
    prefix = picked[0].prefix
    if any(t.prefix != prefix for t in picked):
        raise ValueError("a micro-batch mixes trees that continue a shared prefix with trees that do not")
    pred_index, target_ids = [], []
    for b, t in enumerate(picked):
        input_ids[b, : t.n_tokens] = t.input_ids
        position_ids[b, : t.n_tokens] = t.position_ids
        pred_index.append(t.pred_pos + b * L)
        target_ids.append(t.target_ids)
    n_tokens = sum(t.n_tokens for t in picked)
    lengths = [t.n_tokens for t in picked]
    mask: TreePlan | None
    if B == 1 and picked[0].is_chain and not prefix:
        mask = None  # an unbranched tree is an ordinary causal sequence: SDPA's is_causal path
    elif attention == "segments":
        mask = TreePlan([plan_blocks(t.node_parent, t.node_start, t.n_tokens, prefix) for t in picked], lengths, position_ids,
                        prefix_len=prefix)
    elif attention == "flex":
        flex = flex_tree([(t.node_index, t.node_parent) for t in picked], position_ids, prefix)
        mask = TreePlan([[] for _ in picked], lengths, position_ids, flex=flex, prefix_len=prefix)
    else:
        # keys: the shared prefix (if any), which every row sees, then the row's own tokens
        dense = torch.zeros(B, 1, L, prefix + L, dtype=torch.bool)
        dense[..., :prefix] = True
        pad = torch.arange(L)
        for b, t in enumerate(picked):
            dense[b, 0, : t.n_tokens, prefix : prefix + t.n_tokens] = t.attention_mask()
            # Padding rows attend to themselves only, so no softmax row is empty (NaN); nothing attends to them.
            dense[b, 0, pad[t.n_tokens:], prefix + pad[t.n_tokens:]] = True
        mask = TreePlan([[] for _ in picked], lengths, position_ids, dense, prefix_len=prefix)
    return MicroBatch(input_ids, position_ids, mask, torch.cat(pred_index), torch.cat(target_ids), n_tokens)


def backbone_forward(backbone: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """Last hidden states [B, L, H] of a transformers decoder body on a micro-batch.

    A TreePlan goes to the attention layers as a keyword argument, with an all-ones padding mask
    for HF's mask builders (attention.py explains both); None means plain causal attention.
    """
    if isinstance(mb.attention_mask, TreePlan):
        ones = torch.ones(mb.input_ids.shape, dtype=torch.bool, device=mb.input_ids.device)
        kw = {"attention_mask": ones, TREE_KWARG: mb.attention_mask}
    else:
        kw = {"attention_mask": mb.attention_mask}
    return backbone(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, **kw).last_hidden_state


def head_logits(lm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The LM's logits [T, V] (fp32) for hidden states [T, H], as its own forward computes them.

    Besides the output projection, some architectures rescale (Granite's `logits_scaling`, Cohere's
    `logit_scale`) or soft-cap (Gemma 2's `final_logit_softcapping`) the logits; support.py checks the result against
    the model's forward, so an architecture doing something else is refused rather than mis-scored.
    """
    logits = lm.get_output_embeddings()(hidden).float()
    cfg = lm.config
    if getattr(cfg, "logits_scaling", None):
        logits = logits / cfg.logits_scaling
    if getattr(cfg, "logit_scale", None):
        logits = logits * cfg.logit_scale
    if getattr(cfg, "final_logit_softcapping", None):
        logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    return logits


class PackedPolicy(torch.nn.Module):
    """A causal LM scored on packed micro-batches: the logprob (and entropy) of each scored token.

    Only the predicting positions go through the LM head, so env tokens (most of an agent's
    context) cost no vocabulary projection, and those go through it `head_chunk` at a time
    (lm_head.py), so no [T, V] tensor is ever whole. Wrapping the LM in a module keeps accelerate/DDP hooks
    on the call that computes gradients.
    """

    def __init__(self, lm: torch.nn.Module, head_chunk: int = DEFAULT_CHUNK):
        super().__init__()
        enable_tree_attention(lm)
        self.lm = lm
        self.head_chunk = head_chunk  # scored tokens per LM-head chunk (lm_head.py); <= 0: all at once

    @property
    def backbone(self) -> torch.nn.Module:
        """The decoder body the micro-batches go through (a step's shared prefix too: prefix.py)."""
        return self.lm.base_model

    def forward(self, mb: MicroBatch, with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = backbone_forward(self.backbone, mb)  # [B, L, H]
        h = hidden.reshape(-1, hidden.shape[-1])[mb.pred_index]  # [T, H]
        # [T] logprobs and entropies, the [chunk, V] logits of one chunk alive at a time
        return chunked_logprobs(lambda x: head_logits(self.lm, x), h, mb.target_ids, self.head_chunk, with_entropy)
