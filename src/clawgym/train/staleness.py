"""The staleness bound of an asynchronous step: which groups hold a call sampled too many policy
versions before the weights being trained. Torch-free: the trainer chooses by it and `clawgym run`
reports by it (docs/training.md, "Asynchronous steps")."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from clawgym.artifacts import RolloutRecord


def call_versions(calls: Path) -> dict[str, tuple[int, int]]:
    """Each rollout's oldest and newest policy version among its recorded calls."""
    table = pq.read_table(calls, columns=["rollout_id", "policy_version"]).to_pydict()
    out: dict[str, tuple[int, int]] = {}
    for rid, v in zip(table["rollout_id"], table["policy_version"]):
        lo, hi = out.get(rid, (v, v))
        out[rid] = (min(lo, v), max(hi, v))
    return out


def stale_groups(rollouts: dict[str, RolloutRecord], versions: dict[str, tuple[int, int]], trainer_version: int,
                 max_staleness: int) -> set[str]:
    """The groups holding a rollout with a call sampled more than `max_staleness` versions before
    `trainer_version`: such a group is left out whole, never split (its advantages are relative)."""
    return {r.group_id for rid, r in rollouts.items() if trainer_version - versions.get(rid, (trainer_version,) * 2)[0] > max_staleness}
