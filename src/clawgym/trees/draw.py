"""Draw a rollout's tree in the terminal (what `clawgym inspect trees.parquet --rollout ID` shows).

A path reads top to bottom: consecutive items in one list are parent then child. Where the tree
branches, the branch point gets one nested "branch i/k" list per child, so long unbranched
histories do not march off the right edge of the terminal.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from clawgym.artifacts import TreeNode
from clawgym.errors import UserError

_PREVIEW_TOKENS = 24
_PREVIEW_CHARS = 60


def draw_tree(nodes: Sequence[TreeNode], console: Console, tokenizer: Any = None, *, max_nodes: int = 400) -> None:
    """Print each rollout's tree among `nodes`: kind, role, token count, kept or why not, first words.

    `tokenizer` (anything with `decode(list[int]) -> str`, e.g. a transformers tokenizer) adds the
    first words of each node. At most `max_nodes` nodes per rollout are drawn.
    """
    by_rollout: dict[str, list[TreeNode]] = defaultdict(list)
    for node in nodes:
        by_rollout[node.rollout_id].append(node)
    if not by_rollout:
        console.print("(no tree nodes)")
    for rollout_id, rollout_nodes in by_rollout.items():
        console.print(_rollout_tree(rollout_id, rollout_nodes, tokenizer, max_nodes))


def _rollout_tree(rollout_id: str, nodes: list[TreeNode], tokenizer: Any, max_nodes: int) -> Tree:
    ids = {n.node_id for n in nodes}
    children: dict[int, list[TreeNode]] = defaultdict(list)
    for n in nodes:
        if n.parent_id != -1 and n.parent_id not in ids:
            raise UserError(f"rollout {rollout_id!r}: node {n.node_id} has parent_id {n.parent_id}, which is not a node of that rollout")
        children[n.parent_id].append(n)
    n_leaves = sum(1 for n in nodes if n.node_id not in children)
    tokens = sum(len(n.token_ids) for n in nodes)
    trainable = sum(len(n.token_ids) for n in nodes if n.trainable)
    tree = Tree(f"[bold]rollout {escape(rollout_id)}[/]: {len(nodes)} nodes, {n_leaves} leaves, "
                f"{tokens:,} tokens, {trainable:,} trainable")

    # Each stack entry: (the list to add to, the node to add). A node with one child continues its
    # list; a node with several opens a "branch i/k" list per child.
    stack = list(reversed(_branches(tree, children.get(-1, []))))
    drawn = 0
    while stack:
        container, node = stack.pop()
        if drawn == max_nodes:
            tree.add(f"[dim]… {len(nodes) - drawn} more nodes not drawn[/]")
            break
        item = container.add(_label(node, tokenizer))
        drawn += 1
        kids = children.get(node.node_id, [])
        if len(kids) == 1:
            stack.append((container, kids[0]))
        elif kids:
            stack.extend(reversed(list(zip(_branch_lists(item, len(kids)), kids))))
    return tree


def _branches(tree: Tree, roots: list[TreeNode]) -> list[tuple[Tree, TreeNode]]:
    # One root is drawn in the top list; several roots (prompts differing at the first token) branch.
    if len(roots) <= 1:
        return [(tree, r) for r in roots]
    return list(zip(_branch_lists(tree, len(roots)), roots))


def _branch_lists(item: Tree, k: int) -> list[Tree]:
    return [item.add(f"[dim]branch {i + 1}/{k}[/]") for i in range(k)]


def _label(node: TreeNode, tokenizer: Any) -> str:
    kind = "[bold cyan]model[/]" if node.kind == "model" else "[blue]env[/]"
    verdict = "[green]kept[/]" if node.kept else f"[red]dropped: {escape(node.drop_reason or '?')}[/]"
    if node.trainable:
        verdict += " [green](trained)[/]"
    text = f"#{node.node_id} {kind} {escape(node.role)} · {len(node.token_ids):,} tok · {verdict} · seg {node.segment} · call {escape(node.call_id)}"
    if tokenizer is not None and node.token_ids:
        text += f" · [dim]{escape(_preview(node.token_ids, tokenizer))}[/]"
    return text


def _preview(token_ids: list[int], tokenizer: Any) -> str:
    decoded = tokenizer.decode(list(token_ids[:_PREVIEW_TOKENS]))
    words = re.sub(r"\s+", " ", decoded).strip()
    if len(words) > _PREVIEW_CHARS or len(token_ids) > _PREVIEW_TOKENS:
        words = words[:_PREVIEW_CHARS].rstrip() + "…"
    return repr(words)
