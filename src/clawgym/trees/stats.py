"""What building and filtering the trees did, per rollout and overall: a rich table and a metrics line.

`tree_token_ratio` = tokens stored in the tree ÷ tokens in every call's full prompt and output (the
tokens a per-call trainer would forward). 0.05 means the tree holds 5% of them: shared prefixes are
stored once; `tokens_saved` is the difference. Every filtering decision is counted in `dropped_leaves`, by reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from clawgym.artifacts import MetricsLine

# Every value `TreeNode.drop_reason` can take besides "" (kept).
DROP_REASONS = ("dead_leaf", "failed_call", "over_branching", "excluded_rollout", "aux", "subagent", "compaction")


@dataclass
class RolloutTreeStats:
    """One rollout's tree: its shape, what filtering kept and dropped, and token counts."""

    rollout_id: str
    status: str
    """the rollout's status (ok | timeout | harness_error | infra_error | check_error)"""
    decision: str
    """kept | excluded_rollout | over_branching"""
    calls: int
    failed_calls: int
    """calls whose status is not ok (retried attempts, cancelled streams); never trained on"""
    nodes: int
    leaves: int
    """trajectory ends: nodes without children plus main-trajectory ends"""
    segments: int
    """stretches of the rollout between compaction calls"""
    kept_leaves: int
    """trajectories kept for training (at most one per segment)"""
    dropped_leaves: dict[str, int] = field(default_factory=dict)
    """leaves not kept, by drop reason"""
    tree_tokens: int = 0
    call_tokens: int = 0
    model_tokens: int = 0
    trainable_tokens: int = 0

    @property
    def tree_token_ratio(self) -> float:
        return self.tree_tokens / self.call_tokens if self.call_tokens else 0.0


@dataclass
class TreeStats:
    """All rollouts of one build-trees run."""

    rollouts: list[RolloutTreeStats]
    max_leaves: int

    def total(self, name: str) -> int:
        return sum(getattr(r, name) for r in self.rollouts)

    @property
    def dropped_leaves(self) -> dict[str, int]:
        counts: Counter[str] = Counter({reason: 0 for reason in DROP_REASONS})
        for r in self.rollouts:
            counts.update(r.dropped_leaves)
        return dict(counts)

    @property
    def tree_token_ratio(self) -> float:
        calls = self.total("call_tokens")
        return self.total("tree_tokens") / calls if calls else 0.0

    def decisions(self) -> Counter[str]:
        return Counter(r.decision for r in self.rollouts)

    def to_metrics(self, step: int, time: float = 0.0) -> MetricsLine:
        """The `trees/...` line of metrics.jsonl."""
        decisions = self.decisions()
        ratios = [r.tree_token_ratio for r in self.rollouts if r.call_tokens]
        values: dict[str, float] = {
            "trees/rollouts": len(self.rollouts),
            "trees/rollouts_kept": decisions["kept"],
            "trees/rollouts_excluded": decisions["excluded_rollout"],
            "trees/rollouts_over_branching": decisions["over_branching"],
            "trees/calls": self.total("calls"),
            "trees/calls_failed": self.total("failed_calls"),
            "trees/nodes": self.total("nodes"),
            "trees/leaves": self.total("leaves"),
            "trees/segments": self.total("segments"),
            "trees/trajectories_kept": self.total("kept_leaves"),
            "trees/tree_tokens": self.total("tree_tokens"),
            "trees/call_tokens": self.total("call_tokens"),
            "trees/model_tokens": self.total("model_tokens"),
            "trees/trainable_tokens": self.total("trainable_tokens"),
            "trees/tree_token_ratio": self.tree_token_ratio,
            "trees/tokens_saved": self.total("call_tokens") - self.total("tree_tokens"),
            "trees/tree_token_ratio_mean": sum(ratios) / len(ratios) if ratios else 0.0,
        }
        for reason, n in self.dropped_leaves.items():
            values[f"trees/dropped_leaves/{reason}"] = n
        return MetricsLine(step=step, values=values, time=time)

    def print(self, console: Console, max_rows: int = 20) -> None:
        """Per-rollout table (first `max_rows` rollouts) and the totals."""
        per = Table(title="trees per rollout", title_justify="left")
        for name in ("rollout", "status", "decision", "calls", "leaves", "segments", "kept", "dropped leaves",
                     "trainable tok", "tree tok", "ratio"):
            per.add_column(name, justify="left" if name in ("rollout", "status", "decision", "dropped leaves") else "right")
        for r in self.rollouts[:max_rows]:
            per.add_row(
                r.rollout_id, r.status, r.decision, str(r.calls), str(r.leaves), str(r.segments), str(r.kept_leaves),
                _reasons(r.dropped_leaves), f"{r.trainable_tokens:,}", f"{r.tree_tokens:,}", f"{r.tree_token_ratio:.3f}",
            )
        if len(self.rollouts) > max_rows:
            per.caption = f"{len(self.rollouts) - max_rows} more rollouts not shown"
        if self.rollouts:
            console.print(per)

        decisions = self.decisions()
        tot = Table(title="trees overall", title_justify="left", show_header=False)
        tot.add_column("what")
        tot.add_column("value", justify="right")
        rows = [
            ("rollouts", f"{len(self.rollouts):,}"),
            ("  kept", f"{decisions['kept']:,}"),
            ("  excluded (infra_error, check_error / no reward)", f"{decisions['excluded_rollout']:,}"),
            (f"  over-branching (> {self.max_leaves} leaves)", f"{decisions['over_branching']:,}"),
            ("calls (failed)", f"{self.total('calls'):,} ({self.total('failed_calls'):,})"),
            ("nodes", f"{self.total('nodes'):,}"),
            ("leaves", f"{self.total('leaves'):,}"),
            ("segments", f"{self.total('segments'):,}"),
            ("trajectories kept", f"{self.total('kept_leaves'):,}"),
            ("dropped leaves", _reasons(self.dropped_leaves) or "0"),
            ("trainable tokens", f"{self.total('trainable_tokens'):,}"),
            ("tokens in tree / in calls", f"{self.total('tree_tokens'):,} / {self.total('call_tokens'):,}"),
            ("tree_token_ratio", f"{self.tree_token_ratio:.4f}"),
        ]
        for what, value in rows:
            tot.add_row(what, value)
        console.print(tot)


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in counts.items() if n)
