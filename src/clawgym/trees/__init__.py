"""Prefix trees over token ids: one per rollout, rebuilt from the captured calls (paper §3.2.1–3.2.2).

A harness's calls are fragmented, forked and redundant (retries, subagents, context compaction,
auxiliary calls). `build-trees` inserts each rollout's calls, in arrival order, into one trie over
token ids, so shared prefixes are stored once; marks model tokens (sampled, with logprobs) and env
tokens (everything the harness wrote); then filters: one main trajectory per segment between
compaction points (dead leaves from retries dropped), over-branched and excluded rollouts dropped,
subagent / compaction / aux branches kept in the file but not trainable.

Modules, in pipeline order: `build` (the trie), `filter` (what is kept, and why not), `stats`
(counts, table, metrics line), `stage` (files in, files out), `draw` (the terminal view).

Trainer-facing helpers: `read_trees` groups a trees file by rollout; `training_nodes` selects the
nodes a trainer packs (trainable nodes and their ancestors); `path_to` gives a root-to-node path.
"""

from __future__ import annotations

from collections import defaultdict
from os import PathLike

import pyarrow as pa
import pyarrow.compute as pc

from clawgym.artifacts import TreeNode, read_arrow
from clawgym.trees.draw import draw_tree
from clawgym.trees.stage import (
    DEFAULT_MAX_LEAVES, BuildTreesConfig, BuiltTrees, RolloutTree, build_rollout_tree, build_trees, resolve_config,
    run_build_trees,
)
from clawgym.trees.stats import DROP_REASONS, RolloutTreeStats, TreeStats

__all__ = [
    "DEFAULT_MAX_LEAVES", "DROP_REASONS", "BuildTreesConfig", "BuiltTrees", "RolloutTree", "RolloutTreeStats",
    "TreeStats", "build_rollout_tree", "build_trees", "draw_tree", "path_to", "read_trees", "resolve_config",
    "run_build_trees", "training_nodes",
]


def read_trees(path: str | PathLike, rollout_ids: set[str] | None = None) -> dict[str, list[TreeNode]]:
    """A trees.parquet file as {rollout_id: nodes in node_id order (parents before children)}."""
    table = read_arrow(path, TreeNode)
    if rollout_ids is not None:
        table = table.filter(pc.is_in(table.column("rollout_id"), value_set=pa.array(sorted(rollout_ids), pa.string())))
    trees: dict[str, list[TreeNode]] = defaultdict(list)
    for row in table.to_pylist():
        trees[row["rollout_id"]].append(TreeNode(**row))
    for nodes in trees.values():
        nodes.sort(key=lambda n: n.node_id)
    return dict(trees)


def training_nodes(nodes: list[TreeNode]) -> list[TreeNode]:
    """The nodes a trainer packs for one rollout: every trainable node and all its ancestors, in node_id order.

    Kept paths are closed under ancestors except where a failed call's tokens sit on a kept path;
    this closure is what attention needs either way. Empty when nothing is trainable.
    """
    by_id = {n.node_id: n for n in nodes}
    needed: set[int] = set()
    for n in nodes:
        if n.trainable:
            node_id = n.node_id
            while node_id != -1 and node_id not in needed:
                needed.add(node_id)
                node_id = by_id[node_id].parent_id
    return [by_id[i] for i in sorted(needed)]


def path_to(nodes: list[TreeNode], node_id: int) -> list[TreeNode]:
    """The nodes from a root down to `node_id`, root first."""
    by_id = {n.node_id: n for n in nodes}
    path = []
    while node_id != -1:
        node = by_id[node_id]
        path.append(node)
        node_id = node.parent_id
    return path[::-1]
