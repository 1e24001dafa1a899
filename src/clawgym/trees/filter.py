"""Decide which parts of a built tree are trained on (paper §3.2.2), and count every decision.

Reading order of `filter_tree`:
1. Leaves. A main leaf is where an ok main call ends and no other ok main call continues below it
   (a compaction or aux call hanging off the main history does not end the main trajectory, and a
   failed call cannot continue it). Node leaves (nodes without children) are the ends of every
   other branch: subagents, compaction, aux calls, failed attempts. `leaves` counts both.
2. Rollout-level drops: an excluded rollout (infra_error, check_error, or no reward) and an over-branched one
   (more leaves than `max_leaves`) keep nothing.
3. Dead leaves: within each segment (between compaction points) keep the main leaf with the
   longest path (ties: the later call); its retried or regenerated siblings are dropped.
4. A node is kept when it lies on a kept leaf's path; a model node there that only failed calls
   sampled is not kept (reason failed_call). Every other node records why it was dropped: its
   role when it is not main (aux, subagent, compaction), else failed_call when no ok call reached
   it, else dead_leaf.
"""

from __future__ import annotations

from collections import Counter

from clawgym.trees.build import Node, TreeBuilder
from clawgym.trees.stats import RolloutTreeStats


def filter_tree(builder: TreeBuilder, *, status: str, excluded: bool, max_leaves: int) -> tuple[list[Node], RolloutTreeStats]:
    """Mark `kept` / `drop_reason` on every node of `builder`'s tree; return nodes in pre-order and stats."""
    order = builder.preorder()
    root = builder.root

    # 1. Where ok calls end: every node on an ok call's path is `ok_path`; main ends are leaf candidates.
    for call, end, segment in zip(builder.calls, builder.ends, builder.segments):
        if not call.ok or end is root:
            continue
        node = end
        while node is not root and not node.ok_path:
            node.ok_path = True
            node = node.parent
        if call.role == "main" and call.seq >= end.main_end:
            end.main_end, end.main_end_segment = call.seq, segment
    for node in reversed(order):  # children before parents
        if node.main_end >= 0 or node.main_below:
            node.parent.main_below = True
    main_leaves = [n for n in order if n.main_end >= 0 and not n.main_below]
    leaf_set = {id(n): n for n in order if not n.children}
    leaf_set.update((id(n), n) for n in main_leaves)
    leaves = list(leaf_set.values())

    # 2. Rollout-level decisions come first: they override everything below.
    over_branching = len(leaves) > max_leaves
    rollout_reason = "excluded_rollout" if excluded else "over_branching" if over_branching else ""

    # 3. One main leaf per segment: the longest continuation; the rest are dead leaves.
    kept_leaves: list[Node] = []
    if not rollout_reason:
        best: dict[int, Node] = {}
        for leaf in main_leaves:
            other = best.get(leaf.main_end_segment)
            if other is None or (leaf.end, leaf.main_end) > (other.end, other.main_end):
                best[leaf.main_end_segment] = leaf
        kept_leaves = list(best.values())
        for leaf in kept_leaves:
            node = leaf
            while node is not root and not node.kept:
                node.kept = True
                node = node.parent

    # 4. Per-node verdicts.
    for node in order:
        if rollout_reason:
            node.kept, node.drop_reason = False, rollout_reason
        elif node.kept:
            if node.kind == "model" and not node.sampled_ok:
                node.kept, node.drop_reason = False, "failed_call"
        elif node.role != "main":
            node.drop_reason = node.role
        elif not node.ok_path or (node.kind == "model" and not node.sampled_ok):
            node.drop_reason = "failed_call"
        else:
            node.drop_reason = "dead_leaf"

    kept_ids = {id(n) for n in kept_leaves}
    dropped = Counter(n.drop_reason for n in leaves if id(n) not in kept_ids)
    calls = builder.calls
    stats = RolloutTreeStats(
        rollout_id=builder.rollout_id,
        status=status,
        decision=rollout_reason or "kept",
        calls=len(calls),
        failed_calls=sum(not c.ok for c in calls),
        nodes=len(order),
        leaves=len(leaves),
        segments=len(set(builder.segments)),
        kept_leaves=len(kept_leaves),
        dropped_leaves=dict(sorted(dropped.items())),
        tree_tokens=sum(len(n.tokens) for n in order),
        call_tokens=sum(c.total_len for c in calls),
        model_tokens=sum(len(n.tokens) for n in order if n.kind == "model"),
        trainable_tokens=sum(len(n.tokens) for n in order if n.kept and n.kind == "model" and n.role == "main"),
    )
    return order, stats
