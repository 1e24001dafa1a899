"""A step's batch for `train`: which rollouts train, each one's signal per algorithm, packed trees, minibatches.

- `choose` reads trees.parquet and rollouts.parquet and picks the rollouts that train, with the
  signal of the algorithm: GRPO's group-normalized advantage (zero-variance groups left out and
  counted), PPO's return R (the rollout's reward), SFT's reward filter (`min_reward`).
- `pack` packs each chosen rollout's tree into one sequence (trainable nodes and their ancestors).
- `Scores` are the no-grad passes before any update (logp_old, logp_ref, V_old), which a resumed
  call reads back from the checkpoint; `token_advantages` turns them into the per-token advantage
  (PPO: A_t = R − V(s_t), whitened over the batch; GRPO and SFT: the rollout's signal on every token).
- `minibatches` splits the batch into an epoch's minibatches (seeded per epoch).

The math is in losses.py; docs/training.md has the algorithms' options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from clawgym.artifacts import RolloutRecord, TreeNode, read_table
from clawgym.errors import UserError
from clawgym.layout import StepLayout
from clawgym.train import losses as L
from clawgym.train.config import TrainConfig
from clawgym.train.staleness import call_versions, stale_groups
from clawgym.train.packing import PackedTree, pack_tree
from clawgym.trees import read_trees


@dataclass
class Selection:
    """The rollouts that train and their signal (phases 1–2 of `train`)."""

    nodes: dict[str, list[TreeNode]]
    """every rollout's tree nodes as read, by rollout id"""
    rollout_ids: list[str]
    """the chosen rollouts, in trees.parquet order"""
    signal: dict[str, float]
    """per chosen rollout: GRPO its advantage, PPO its return, SFT its reward"""
    groups: int
    zero_var_groups: int
    stale_groups: int = 0
    """groups left out whole under --max-staleness"""


def choose(cfg: TrainConfig) -> Selection:
    """Read the step's trees and rollouts and choose what trains, with its signal per `cfg.algo`."""
    rollouts = {r.rollout_id: r for r in read_table(cfg.rollouts, RolloutRecord)}
    nodes = read_trees(cfg.trees)
    missing = sorted(set(nodes) - set(rollouts))
    if missing:
        raise UserError(f"{cfg.trees}: rollout {missing[0]!r} has no row in {cfg.rollouts}")
    if not any(n.trainable for tree in nodes.values() for n in tree):
        raise UserError(f"{cfg.trees}: no trainable tokens (no kept model node of role main)")

    ids = [rid for rid in nodes if rollouts[rid].trainable and any(n.trainable for n in nodes[rid])]
    stale: set[str] = set()
    if cfg.max_staleness is not None:  # an asynchronous step: every trained token within the bound (docs/training.md)
        calls = cfg.calls if cfg.calls is not None else StepLayout(Path(cfg.trees).parent).calls
        stale = stale_groups(rollouts, call_versions(calls), cfg.policy_version, cfg.max_staleness)
        ids = [rid for rid in ids if rollouts[rid].group_id not in stale]
        require_behaviour_logprobs(nodes, ids)
    rewards = torch.tensor([float(rollouts[rid].reward) for rid in ids], dtype=torch.float64)  # [R]
    groups = sorted({rollouts[rid].group_id for rid in ids})
    zero_var_groups = 0
    if cfg.algo == "grpo":
        group_index = torch.tensor([groups.index(rollouts[rid].group_id) for rid in ids], dtype=torch.long)
        adv, zero = L.grpo_advantages(rewards, group_index, cfg.adv_eps)  # empty in, empty out
        zero_var_groups = len({int(g) for g, z in zip(group_index, zero) if z})
        signal = {rid: float(a) for rid, a, z in zip(ids, adv, zero) if not z}
    elif cfg.algo == "ppo":
        signal = {rid: float(r) for rid, r in zip(ids, rewards)}
    else:
        signal = {rid: float(r) for rid, r in zip(ids, rewards) if r >= cfg.min_reward}
    return Selection(nodes, [rid for rid in ids if rid in signal], signal, len(groups), zero_var_groups, len(stale))


def require_behaviour_logprobs(nodes: dict[str, list[TreeNode]], ids: list[str]) -> None:
    """Off-policy tokens are weighted by the engine's logprobs of them: a trainable node without one
    per token is refused, never trained with recomputed values."""
    for rid in ids:
        for n in nodes[rid]:
            if n.trainable and len(n.logprobs) != len(n.token_ids):
                raise UserError(f"rollout {rid!r}: node {n.node_id} has {len(n.logprobs)} recorded logprobs for "
                                f"{len(n.token_ids)} sampled tokens; an asynchronous step trains only tokens whose "
                                f"behaviour logprobs were recorded")


@dataclass
class Batch:
    """The chosen rollouts packed, one tree each, with what every update reads of them."""

    trees: list[PackedTree]
    selection: Selection
    returns: list[torch.Tensor]
    """per tree [T]: its signal on every scored token (GRPO: the advantage; PPO: the return R)"""
    logp_rollout: list[torch.Tensor]
    """per tree [T]: the engine's logprobs of the scored tokens"""

    @property
    def trainable_tokens(self) -> int:
        return sum(t.n_trainable for t in self.trees)

    @property
    def tokens_saved(self) -> int:
        """tokens that packing each tree once saves over forwarding every root-to-leaf path on its own"""
        return sum(t.path_tokens - t.n_tokens for t in self.trees)

    def token_weights(self, rows: list[int], mode: str) -> dict[int, torch.Tensor]:
        """Aggregation weights over the trees `rows` (Σ = 1), split back per tree so micro-batches sum exactly."""
        seq_index = torch.cat([torch.full((self.trees[i].n_trainable,), j) for j, i in enumerate(rows)])
        w = L.aggregation_weights(seq_index, mode)
        return dict(zip(rows, w.split([self.trees[i].n_trainable for i in rows])))

    def summary(self, algo: str, world: int) -> str:
        s = self.selection
        return (f"train {algo}: {len(self.trees)}/{len(s.nodes)} rollouts, {self.trainable_tokens} trainable tokens, "
                f"{sum(t.n_tokens for t in self.trees)} packed tokens for {sum(t.path_tokens for t in self.trees)} on paths, "
                f"{s.zero_var_groups}/{s.groups} zero-variance groups, {world} process(es)"
                + (f", {s.stale_groups} group(s) left out as too stale (--max-staleness)" if s.stale_groups else ""))


def pack(cfg: TrainConfig, selection: Selection) -> Batch:
    """Pack each chosen rollout's tree (trainable nodes and their ancestors only)."""
    try:
        trees = [pack_tree(selection.nodes[rid]) for rid in selection.rollout_ids]
    except UserError as e:
        raise UserError(f"{cfg.trees}: {e}") from None
    returns = [torch.full((t.n_trainable,), selection.signal[t.rollout_id], dtype=torch.float32) for t in trees]
    return Batch(trees, selection, returns, [t.rollout_logprobs[t.trainable] for t in trees])


@dataclass
class Scores:
    """Per tree [T], from no-grad passes before any update; saved with an epoch checkpoint for --resume."""

    logp_old: list[torch.Tensor]
    logp_ref: list[torch.Tensor] | None = None
    """only with a KL reference model"""
    values: list[torch.Tensor] | None = None
    """PPO: V_old, after the value warm-up"""

    def state(self) -> dict[str, list[torch.Tensor]]:
        """As checkpoint.BATCH_FILE holds them."""
        out = {"logp_old": self.logp_old}
        if self.logp_ref is not None:
            out["logp_ref"] = self.logp_ref
        if self.values is not None:
            out["values"] = self.values
        return out

    @classmethod
    def from_state(cls, state: dict[str, list[torch.Tensor]]) -> Scores:
        return cls(state["logp_old"], state.get("logp_ref"), state.get("values"))


def token_advantages(batch: Batch, scores: Scores, cfg: TrainConfig) -> list[torch.Tensor]:
    """Per tree [T]: PPO's A_t = R − V(s_t), whitened over the batch (under its aggregation weights) if
    `cfg.norm_adv`; GRPO and SFT: the returns (the rollout's signal on every token)."""
    if scores.values is None:
        return batch.returns
    adv = [L.ppo_advantages(v, r) for v, r in zip(scores.values, batch.returns)]
    if not cfg.norm_adv:
        return adv
    rows = list(range(len(batch.trees)))
    weights = batch.token_weights(rows, cfg.aggregation)
    flat = L.whiten(torch.cat(adv), torch.cat([weights[i] for i in rows]))
    return list(flat.split([t.n_trainable for t in batch.trees]))


def minibatches(n_trees: int, cfg: TrainConfig, epoch: int) -> list[list[int]]:
    """An epoch's minibatches: the trees in an order seeded by (seed, epoch), dealt into `cfg.minibatches` parts."""
    order = torch.randperm(n_trees, generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch)).tolist()
    n = min(cfg.minibatches, n_trees)
    return [order[k::n] for k in range(n)]
