"""Insert one rollout's calls, in arrival order, into a prefix tree over token ids (paper §3.2.1).

The tree is a radix trie: each node holds a run of tokens, all of one kind (`env`: prompt text the
harness sent; `model`: tokens the policy sampled, with their logprobs). A call is attached where its
prompt leaves the existing tree (the longest common prefix), its remaining prompt tokens become an
env node, and its sampled tokens a model node. Nodes are split where paths branch, where kinds
change, and where a call's prompt or output ends, so that every call is a root-to-node path.

Cost is linear in the tokens the calls *store*. A delta-encoded prompt (docs/architecture.md, calls) starts with
`prompt_base_len` tokens of its base call's prompt+output: that prefix is already a path in the tree,
so the builder walks up from where the base call ended to that depth (a few nodes, not tokens) and
only matches and inserts the stored tail. Node tokens are numpy views into the calls' arrays, so
building copies no token lists; comparisons against existing nodes are vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

from clawgym.artifacts import ArtifactError, check_base_len

EMPTY_IDS = np.empty(0, dtype=np.int32)


@dataclass(frozen=True, slots=True)
class CallView:
    """One call as the builder reads it; token arrays are numpy views, the prompt maybe delta-encoded."""

    call_id: str
    seq: int
    role: str
    status: str
    base: int
    """index (in this rollout's arrival order) of the call the prompt is delta-encoded against, or -1"""
    base_len: int
    """tokens taken from the base call's prompt+output before `tail`"""
    tail: np.ndarray
    """int32: the stored prompt tokens (the whole prompt when `base` is -1)"""
    output: np.ndarray
    """int32: sampled tokens"""
    logprobs: np.ndarray
    """float32: one per sampled token"""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def prompt_len(self) -> int:
        return self.base_len + len(self.tail)

    @property
    def total_len(self) -> int:
        """Tokens of the full prompt plus output: what a naive trainer would forward for this call."""
        return self.base_len + len(self.tail) + len(self.output)


class Node:
    """A run of tokens in the trie. `depth` is the position of its first token on its path."""

    __slots__ = (
        "parent", "children", "tokens", "logprobs", "kind", "depth", "call", "role", "segment",
        "sampled_ok", "ok_path", "main_end", "main_end_segment", "main_below", "kept", "drop_reason", "index",
    )

    def __init__(self, parent: Node | None, tokens: np.ndarray, logprobs: np.ndarray | None, kind: str,
                 depth: int, call: int, role: str, segment: int, sampled_ok: bool):
        self.parent = parent
        self.children: dict[int, Node] = {}  # keyed by first token; insertion order = creation order
        self.tokens = tokens
        self.logprobs = logprobs  # None for env nodes
        self.kind = kind
        self.depth = depth
        self.call = call  # index of the call that created (or last claimed) the node
        self.role = role
        self.segment = segment
        self.sampled_ok = sampled_ok  # model nodes: sampled by at least one call whose status is ok
        # Filled in by filtering (see filter.py).
        self.ok_path = False  # on the path of at least one ok call
        self.main_end = -1  # seq of the latest ok main call that ends here, or -1
        self.main_end_segment = -1
        self.main_below = False  # an ok main call ends strictly below this node
        self.kept = False
        self.drop_reason = ""
        self.index = -1  # node_id: position in depth-first pre-order

    @property
    def end(self) -> int:
        return self.depth + len(self.tokens)

    def __repr__(self) -> str:  # for debugging and test failure messages
        return f"Node({self.kind}, {self.role}, depth={self.depth}, n={len(self.tokens)}, children={len(self.children)})"


class TreeBuilder:
    """Builds one rollout's trie; `add` each call in arrival order, then read `root` / `preorder()`."""

    def __init__(self, rollout_id: str, path: str = "<calls>"):
        self.rollout_id = rollout_id
        self.path = path  # the calls file, for error messages
        self.root = Node(None, EMPTY_IDS, None, "env", 0, -1, "main", 0, True)
        self.calls: list[CallView] = []
        self.ends: list[Node] = []  # per call: the node whose last token is the call's last token
        self.segments: list[int] = []  # per call: its segment (compaction calls close a segment)
        self._segment = 0

    # -- inserting --------------------------------------------------------------------------------

    def add(self, call: CallView) -> None:
        i = len(self.calls)
        self._check(call, i)
        segment = self._segment
        if call.role == "compaction":
            # The compaction call summarises the segment it closes; calls after it start the next one.
            self._segment += 1

        if call.base >= 0:
            node, off = self._locate(self.ends[call.base], call.base_len)
        else:
            node, off = self.root, 0
        node, off = self._walk(node, off, call.tail, call, i, segment, model=False)
        prompt_end = self._cut(node, off)
        node, off = self._walk(prompt_end, len(prompt_end.tokens), call.output, call, i, segment, model=True)
        end = self._cut(node, off)

        if call.role == "main":
            # A node a main call passes through belongs to the main trajectory even if an aux or
            # subagent call created it first (e.g. a shared system prompt). Ancestors of a main node
            # that an earlier call left are already main, so the walk stops at the first one.
            n = end
            while n is not self.root and (n.call == i or n.role != "main"):
                n.role = "main"
                n = n.parent
        self.calls.append(call)
        self.ends.append(end)
        self.segments.append(segment)

    def _check(self, call: CallView, i: int) -> None:
        where = f"call {call.call_id!r} (seq {call.seq}) of rollout {self.rollout_id!r}"
        if len(call.logprobs) != len(call.output):
            raise ArtifactError(self.path, "output_logprobs",
                                f"{where} has {len(call.logprobs)} logprobs for {len(call.output)} output tokens")
        if call.base >= i:
            raise ArtifactError(self.path, "prompt_base_call", f"{where} is delta-encoded against a later call")
        base = self.calls[call.base] if call.base >= 0 else None
        check_base_len(self.path, where, call.base_len, base.call_id if base else None, base.total_len if base else 0)

    def _locate(self, end: Node, depth: int) -> tuple[Node, int]:
        """The position `depth` tokens down the path that ends at `end`, as (node, tokens into it)."""
        node = end
        while node.depth > depth:
            node = node.parent
        off = depth - node.depth
        if off == 0 and node is not self.root:
            # Positions on a boundary are "at the end of the parent", where children are looked up.
            node = node.parent
            off = len(node.tokens)
        return node, off

    def _walk(self, node: Node, off: int, seq: np.ndarray, call: CallView, i: int, segment: int,
              model: bool) -> tuple[Node, int]:
        """Follow `seq` down from (node, off) as far as the tree matches, then hang the rest below.

        Returns the position after the last token of `seq`. With `model`, matched tokens are
        marked as sampled (an env run the policy happened to sample becomes a model node).
        """
        n, j = len(seq), 0
        while j < n:
            if off == len(node.tokens):
                child = node.children.get(int(seq[j]))
                if child is None:
                    child = self._new_child(node, seq[j:], call, i, segment, model, call.logprobs[j:] if model else None)
                    return child, len(child.tokens)
                node, off = child, 0
            m = min(len(node.tokens) - off, n - j)
            diff = np.flatnonzero(node.tokens[off:off + m] != seq[j:j + m])
            k = int(diff[0]) if diff.size else m
            if model and k and (node.kind != "model" or (call.ok and not node.sampled_ok)):
                node = self._claim(node, off, off + k, call.logprobs[j:j + k], call, i)
                off = len(node.tokens)
            else:
                off += k
            j += k
            if j < n and off < len(node.tokens):
                # Diverged inside a node: split there; the next turn of the loop hangs the rest below.
                node = self._split(node, off)
                off = len(node.tokens)
        return node, off

    def _cut(self, node: Node, off: int) -> Node:
        """Make (node, off) a node boundary and return the node that ends there."""
        if off == len(node.tokens):
            return node
        if off == 0:
            return node.parent
        return self._split(node, off)

    def _split(self, node: Node, k: int) -> Node:
        """Split `node` after k tokens; the new upper node is returned, `node` keeps its end and children."""
        upper = Node(node.parent, node.tokens[:k], None if node.logprobs is None else node.logprobs[:k],
                     node.kind, node.depth, node.call, node.role, node.segment, node.sampled_ok)
        node.parent.children[int(node.tokens[0])] = upper
        upper.children[int(node.tokens[k])] = node
        node.parent = upper
        node.tokens = node.tokens[k:]
        if node.logprobs is not None:
            node.logprobs = node.logprobs[k:]
        node.depth += k
        return upper

    def _claim(self, node: Node, a: int, b: int, logprobs: np.ndarray, call: CallView, i: int) -> Node:
        """Tokens [a, b) of `node` were sampled by `call`: isolate them and make them a model node."""
        if b < len(node.tokens):
            node = self._split(node, b)
        if a > 0:
            self._split(node, a)
        # Only env runs and model runs no ok call sampled are claimed, so the claiming call decides.
        node.kind = "model"
        node.logprobs = logprobs
        node.sampled_ok = call.ok
        node.call = i
        if node.role != "main":
            node.role = call.role
        return node

    def _new_child(self, parent: Node, tokens: np.ndarray, call: CallView, i: int, segment: int, model: bool,
                   logprobs: np.ndarray | None) -> Node:
        child = Node(parent, tokens, logprobs, "model" if model else "env", parent.end, i, call.role, segment,
                     call.ok if model else True)
        parent.children[int(tokens[0])] = child
        return child

    # -- reading ----------------------------------------------------------------------------------

    def preorder(self) -> list[Node]:
        """Every node but the virtual root, depth-first, parents before children; sets `index`."""
        order: list[Node] = []
        stack = list(reversed(self.root.children.values()))
        while stack:
            node = stack.pop()
            node.index = len(order)
            order.append(node)
            if node.children:
                stack.extend(reversed(node.children.values()))
        return order
