"""The build-trees stage: calls.parquet + rollouts.parquet → trees.parquet, a stats table, a metrics line.

Reads the calls table column-wise: token lists stay in pyarrow's flat buffers and each call's
prompt tail and output are numpy views into them, so nothing quadratic is ever materialised.
Rollouts are built one at a time (in the rollouts file's order) and their nodes are appended to
column buffers, so memory holds the input, the output, and one rollout's trie.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from clawgym.artifacts import (
    CALL_ROLES, CALL_STATUSES, ArtifactError, CallRecord, RolloutRecord, TreeNode, append_metrics, link_bases,
    read_arrow, read_table, write_config, write_table,
)
from clawgym.errors import UserError
from clawgym.layout import StepLayout, config_beside
from clawgym.trees.build import CallView, Node, TreeBuilder
from clawgym.trees.filter import filter_tree
from clawgym.trees.stats import RolloutTreeStats, TreeStats

DEFAULT_MAX_LEAVES = 64
"""Leaves above which a rollout counts as over-branched, for a caller that gives none: the
default of the recipe's [trees] max_leaves field, which `clawgym build-trees --max-leaves` is
(config.TreesSection, where its reason is; a test keeps the two equal, as importing the recipe
module here would close an import circle)"""


@dataclass
class BuildTreesConfig:
    """The resolved arguments of one build-trees run (written next to the output)."""

    calls: str
    rollouts: str
    out: str
    max_leaves: int = DEFAULT_MAX_LEAVES
    metrics: str | None = None
    """metrics.jsonl to append the `trees/...` line to; None: do not append"""
    step: int | None = None
    """the step of the metrics line; None: the rollouts' step"""


@dataclass
class RolloutTree:
    """One rollout's filtered tree as rows, and its stats."""

    nodes: list[TreeNode]
    stats: RolloutTreeStats


@dataclass
class BuiltTrees:
    """Every rollout's tree as one table of `TreeNode.SCHEMA`, and the stats."""

    table: pa.Table
    stats: TreeStats


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def resolve_config(step_dir: Path | None, calls: Path | None, rollouts: Path | None, out: Path | None,
                   max_leaves: int = DEFAULT_MAX_LEAVES, metrics: Path | None = None,
                   step: int | None = None) -> BuildTreesConfig:
    """Turn CLI arguments into a config: a step directory supplies defaults, options override them."""
    if max_leaves < 1:
        raise UserError(f"--max-leaves must be at least 1, got {max_leaves}")
    if step_dir is not None:
        if not step_dir.is_dir():
            raise UserError(f"{step_dir}: not a directory (expected a step directory holding calls.parquet and rollouts.parquet)")
        folder = StepLayout(step_dir)
        calls, rollouts, out = calls or folder.calls, rollouts or folder.rollouts, out or folder.trees
        found = folder.in_run()
        if found is not None:  # a loop step's folder: its trees/ line goes to the run's metrics.jsonl
            run, number = found
            metrics = metrics or run.metrics
            step = number if step is None else step
    missing = [flag for flag, value in (("--calls", calls), ("--rollouts", rollouts), ("--out", out)) if value is None]
    if missing:
        raise UserError(f"give a STEP_DIR or all of --calls, --rollouts and --out (missing: {', '.join(missing)})")
    if Path(out).resolve() in (Path(calls).resolve(), Path(rollouts).resolve()):
        raise UserError(f"--out {out} would overwrite an input file")
    return BuildTreesConfig(str(calls), str(rollouts), str(out), max_leaves, str(metrics) if metrics else None, step)


def run_build_trees(config: BuildTreesConfig, console: Console) -> TreeStats:
    """Read the inputs, build and filter every tree, write trees.parquet (+ config), report."""
    started = time.perf_counter()
    rollouts = read_table(config.rollouts, RolloutRecord)
    calls = read_arrow(config.calls, CallRecord)
    if config.step is None:
        # No step given and none in the directory name: the rollouts know which step made them.
        config.step = max((r.step for r in rollouts), default=0)

    with Progress(TextColumn("building trees"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task("trees", total=len(rollouts))
        built = build_trees(calls, rollouts, max_leaves=config.max_leaves, calls_path=config.calls,
                            on_rollout=lambda: progress.advance(task))
    del calls
    out = Path(config.out)
    write_table(out, built.table, TreeNode)
    write_config(config_beside(out), config)

    built.stats.print(console)
    if config.metrics:
        append_metrics(config.metrics, built.stats.to_metrics(config.step, time.time()))
    elapsed = time.perf_counter() - started
    console.print(f"wrote {out} ({built.table.num_rows:,} nodes) in {elapsed:.1f} s"
                  + (f"; appended trees/ metrics to {config.metrics}" if config.metrics else ""))
    return built.stats


def build_trees(calls: pa.Table, rollouts: Sequence[RolloutRecord], *, max_leaves: int = DEFAULT_MAX_LEAVES,
                calls_path: str = "<calls>", on_rollout: Callable[[], None] | None = None) -> BuiltTrees:
    """Build and filter one tree per rollout from a calls table (as `read_arrow` returns it).

    Rollouts come out in the order of `rollouts`; one with no calls gets no nodes. A call whose
    rollout is not in `rollouts` is an error.
    """
    by_id: dict[str, RolloutRecord] = {}
    for r in rollouts:
        if r.rollout_id in by_id:
            raise ArtifactError("<rollouts>", "rollout_id", f"rollout {r.rollout_id!r} appears twice")
        by_id[r.rollout_id] = r
    grouped = dict(_rollout_calls(calls, calls_path))
    unknown = [rid for rid in grouped if rid not in by_id]
    if unknown:
        raise ArtifactError(calls_path, "rollout_id",
                            f"calls of rollout {unknown[0]!r} have no row in the rollouts table ({len(unknown)} such rollouts)")

    columns = _NodeColumns()
    stats = []
    for r in rollouts:
        builder = TreeBuilder(r.rollout_id, calls_path)
        for view in grouped.pop(r.rollout_id, []):
            builder.add(view)
        order, rollout_stats = filter_tree(builder, status=r.status, excluded=not r.trainable, max_leaves=max_leaves)
        columns.add(builder, order)
        stats.append(rollout_stats)
        if on_rollout is not None:
            on_rollout()
    return BuiltTrees(columns.table(), TreeStats(stats, max_leaves))


def build_rollout_tree(calls: Sequence[CallRecord], rollout: RolloutRecord | None = None, *,
                       max_leaves: int = DEFAULT_MAX_LEAVES) -> RolloutTree:
    """Build and filter one rollout's tree from its call records (delta-encoded or full prompts).

    Without `rollout` the rollout counts as trainable with status ok. The records must all belong
    to one rollout; they are taken in `seq` order.
    """
    rollout_ids = {c.rollout_id for c in calls}
    if len(rollout_ids) > 1:
        raise ArtifactError("<calls>", "rollout_id", f"calls of several rollouts given: {sorted(rollout_ids)}")
    rollout_id = rollout.rollout_id if rollout else next(iter(rollout_ids), "")
    if rollout_ids and rollout_id not in rollout_ids:
        raise ArtifactError("<calls>", "rollout_id", f"calls belong to rollout {next(iter(rollout_ids))!r}, not {rollout_id!r}")
    for c in calls:
        for name, allowed in (("role", CALL_ROLES), ("status", CALL_STATUSES)):
            if getattr(c, name) not in allowed:
                raise ArtifactError("<calls>", name, f"call {c.call_id!r} has {name} {getattr(c, name)!r}; allowed: {', '.join(allowed)}")
    ordered = sorted(calls, key=lambda c: c.seq)
    bases = link_bases(rollout_id, [(c.call_id, c.seq, c.prompt_base_call) for c in ordered], "<calls>")
    builder = TreeBuilder(rollout_id)
    for c, base in zip(ordered, bases):
        builder.add(CallView(
            c.call_id, c.seq, c.role, c.status, base, c.prompt_base_len,
            np.asarray(c.prompt_ids, dtype=np.int32), np.asarray(c.output_ids, dtype=np.int32),
            np.asarray(c.output_logprobs, dtype=np.float32),
        ))
    excluded = rollout is not None and not rollout.trainable
    order, stats = filter_tree(builder, status=rollout.status if rollout else "ok", excluded=excluded, max_leaves=max_leaves)
    return RolloutTree([_tree_node(builder, n) for n in order], stats)


# ---------------------------------------------------------------------------------------------
# Reading calls column-wise
# ---------------------------------------------------------------------------------------------


def _rollout_calls(calls: pa.Table, path: str) -> Iterator[tuple[str, list[CallView]]]:
    """(rollout_id, its calls in seq order) for each rollout of a calls table."""
    if calls.num_rows == 0:
        return
    order = pc.sort_indices(calls, sort_keys=[("rollout_id", "ascending"), ("seq", "ascending")]).to_numpy()
    rollout_ids = calls.column("rollout_id").to_pylist()
    call_ids = calls.column("call_id").to_pylist()
    seqs = calls.column("seq").to_pylist()
    roles = calls.column("role").to_pylist()
    statuses = calls.column("status").to_pylist()
    base_calls = calls.column("prompt_base_call").to_pylist()
    base_lens = calls.column("prompt_base_len").to_pylist()
    prompt = _flat_lists(calls, "prompt_ids", path, call_ids)
    output = _flat_lists(calls, "output_ids", path, call_ids)
    logprobs = _flat_lists(calls, "output_logprobs", path, call_ids)

    start = 0
    while start < len(order):
        rid = rollout_ids[order[start]]
        stop = start
        while stop < len(order) and rollout_ids[order[stop]] == rid:
            stop += 1
        rows = order[start:stop].tolist()
        bases = link_bases(rid, [(call_ids[r], seqs[r], base_calls[r]) for r in rows], path)
        yield rid, [
            CallView(call_ids[r], seqs[r], roles[r], statuses[r], base, base_lens[r],
                     prompt(r), output(r), logprobs(r))
            for r, base in zip(rows, bases)
        ]
        start = stop


def _flat_lists(table: pa.Table, name: str, path: str, call_ids: list[str]) -> Callable[[int], np.ndarray]:
    """A function row -> numpy view of that row's list, over the column's one flat buffer."""
    column = table.column(name).combine_chunks()
    if column.null_count:
        row = column.is_null().to_numpy(zero_copy_only=False).argmax()
        raise ArtifactError(path, name, f"is null for call {call_ids[row]!r}")
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy()
    return lambda row: values[offsets[row]:offsets[row + 1]]


# ---------------------------------------------------------------------------------------------
# Writing nodes
# ---------------------------------------------------------------------------------------------


def _tree_node(builder: TreeBuilder, node: Node) -> TreeNode:
    return TreeNode(
        rollout_id=builder.rollout_id,
        node_id=node.index,
        parent_id=node.parent.index if node.parent is not builder.root else -1,
        token_ids=node.tokens.tolist(),
        kind=node.kind,
        logprobs=node.logprobs.tolist() if node.logprobs is not None else [],
        call_id=builder.calls[node.call].call_id,
        segment=node.segment,
        role=node.role,
        kept=node.kept,
        depth=node.depth,
        drop_reason=node.drop_reason,
    )


class _NodeColumns:
    """Column buffers for `TreeNode.SCHEMA`; token and logprob lists are concatenated once at the end."""

    def __init__(self) -> None:
        self.scalars: dict[str, list] = {name: [] for name in TreeNode.SCHEMA.names if name not in ("token_ids", "logprobs")}
        self.tokens: list[np.ndarray] = []
        self.logprobs: list[np.ndarray] = []
        self._no_logprobs = np.empty(0, dtype=np.float32)

    def add(self, builder: TreeBuilder, order: list[Node]) -> None:
        s = self.scalars
        root = builder.root
        for node in order:
            s["rollout_id"].append(builder.rollout_id)
            s["node_id"].append(node.index)
            s["parent_id"].append(node.parent.index if node.parent is not root else -1)
            s["kind"].append(node.kind)
            s["call_id"].append(builder.calls[node.call].call_id)
            s["segment"].append(node.segment)
            s["role"].append(node.role)
            s["kept"].append(node.kept)
            s["depth"].append(node.depth)
            s["drop_reason"].append(node.drop_reason)
            self.tokens.append(node.tokens)
            self.logprobs.append(node.logprobs if node.logprobs is not None else self._no_logprobs)

    def table(self) -> pa.Table:
        columns = {name: pa.array(values, type=TreeNode.SCHEMA.field(name).type) for name, values in self.scalars.items()}
        columns["token_ids"] = _list_array(self.tokens, np.int32)
        columns["logprobs"] = _list_array(self.logprobs, np.float32)
        return pa.table({name: columns[name] for name in TreeNode.SCHEMA.names}, schema=TreeNode.SCHEMA)


def _list_array(arrays: list[np.ndarray], dtype: type) -> pa.Array:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ArtifactError("<trees>", "token_ids", f"{offsets[-1]:,} tokens exceed one Parquet list column (2^31); build fewer rollouts per file")
    values = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
