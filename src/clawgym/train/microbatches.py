"""This rank's micro-batches of a minibatch: token-budget plans, padding steps and gradient sync behind one iterator.

`train` splits each minibatch (a set of packed trees) into micro-batches that fit `token_budget`,
forwards and backwards them one at a time and steps the optimizer once. Under data parallelism
(distributed.py) every rank holds a shard of the trees (`shard`), plans only its own part, and pads
its list of micro-batches with zero-weight steps up to the longest rank's, so every rank makes the
same forward/backward calls. `RankMicroBatches` hides all of that:

    plan = micro.plan(rows)                 # this rank's steps of minibatch `rows`, padded
    for step in micro.steps(plan, model):   # collated, on the device
        loss = (micro.token_weights(w, step) * per_token_loss).sum()
        micro.backward(step, loss)          # × world size; gradients all-reduced once per minibatch

A padding step forwards the batch's smallest tree with weight zero, so it adds exactly nothing.
DDP all-reduces gradients once per minibatch: every step but the last is forwarded and
back-propagated under `no_sync` (`steps` holds it around each yield, since DDP decides at the
forward whether the backward reduces), or, after a prefix shared across ranks, every step is and the
gradients are averaged by hand once the prefix's backward is done. FSDP reduce-scatters every
micro-batch into the shards, since skipping that would keep whole unsharded gradients.
docs/training.md describes the scheme.

On the CPU, the heap memory a step freed is handed back to the OS before the next step, so a
step's peak is its own micro-batch's, not the sum of the ones before it.

With `step_prefix` (`--share-prefixes`, one process or DDP) a prompt that the minibatch's trees share
is planned apart (prefix.py): `steps` forwards it once through `model` before the first step (on
several ranks, on one of them, taking turns, and broadcast) and, once the last step's backward is
done, back-propagates the gradients the steps left on its keys/values.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from clawgym import peak_memory
from clawgym.train import prefix, trie
from clawgym.train.distributed import Dist, pad, padded_plan, shard
from clawgym.train.packing import MicroBatch, PackedTree, collate

KEPT_PLANS = 4
"""plans `RankMicroBatches.plan` keeps (minibatches recur from epoch to epoch only when there is one an epoch)"""

Planned = tuple[list[int], list[PackedTree]]
"""one planned micro-batch: the trees it scores (indices, in label order) and the trees or tries to collate"""


class RankPlan(list):
    """This rank's micro-batches of a minibatch (`Planned`, or None: a padding step), and the token ids of
    the shared prefix they continue (prefix.py), alike on every rank, or None."""

    prefix: torch.Tensor | None = None


@dataclass(frozen=True)
class MicroStep:
    """One forward/backward call of this rank."""

    rows: list[int]
    """the trees whose tokens this step scores, in label order (a padding step: the filler tree)"""
    batch: MicroBatch
    """collated, on the device"""
    padding: bool
    """a zero-weight step, only there so every rank makes the same calls"""
    forwarded: int
    """real tokens this process forwarded for this step: its own (none for a padding step), and a shared prefix
    forwarded just before it"""


class RankMicroBatches:
    """Plans, collates and back-propagates this rank's micro-batches of the packed `trees`."""

    def __init__(self, trees: Sequence[PackedTree], dist: Dist, accelerator, *, token_budget: int,
                 share_prefixes: bool, attention: str, sharded: bool, step_prefix: bool = False):
        self.trees, self.dist, self.accelerator = list(trees), dist, accelerator
        self.token_budget, self.share_prefixes, self.attention, self.sharded = token_budget, share_prefixes, attention, sharded
        # prefix.unavailable says when not; a shared prefix's owner rank takes turns (`steps` counts them)
        self.step_prefix = step_prefix and share_prefixes and not (sharded and dist.world > 1)
        self.turn = 0
        # the last few plans by trees and budget: with one minibatch an epoch, every epoch plans the same trees
        self.plans: dict[tuple[frozenset[int], int], RankPlan] = {}
        self.owner = shard([t.n_tokens for t in self.trees], dist.world)
        # The tree a padding step forwards: the smallest, so padding costs least.
        self.filler = min(range(len(self.trees)), key=lambda i: self.trees[i].n_tokens, default=0)

    def plan(self, rows: Sequence[int]) -> RankPlan:
        """This rank's micro-batches of the minibatch `rows` (group tries when sharing prefixes), padded.

        A step prefix is chosen over the whole minibatch, so every rank plans the same one (prefix.plan_ranks).
        The plan of a set of trees is made once (in their index order): epochs deal the same trees again,
        and every rank plans every rank's part."""
        key = (frozenset(rows), self.token_budget)
        if key not in self.plans:
            if len(self.plans) >= KEPT_PLANS:
                del self.plans[next(iter(self.plans))]  # the oldest
            self.plans[key] = self._plan(sorted(rows))
        return self.plans[key]

    def _plan(self, rows: list[int]) -> RankPlan:
        if self.step_prefix:
            parts = [[i for i in rows if self.owner[i] == r] for r in range(self.dist.world)]
            plans, ids = prefix.plan_ranks(self.trees, parts, self.token_budget)
            plan = RankPlan(pad(plans, self.dist.rank))
            plan.prefix = ids
            return plan
        return RankPlan(padded_plan(rows, self.owner, self.dist.rank, self.dist.world,
                                    lambda mine: trie.plan(self.trees, mine, self.token_budget, self.share_prefixes)))

    def steps(self, plan: RankPlan, module) -> Iterator[MicroStep]:
        """The planned steps collated one at a time and moved to the device, for `module` to forward.

        If the plan continues a shared prefix, `module`'s backbone forwards it first (with grad if grad
        is on) and it is back-propagated after the last step's backward (prefix.py).
        """
        shared = None
        if plan.prefix is not None:
            owner, self.turn = self.turn % self.dist.world, self.turn + 1
            with self.accelerator.autocast():
                # the decoder body of a PackedPolicy or a ValueModel, as its forward calls it
                shared = prefix.SharedPrefix(self.accelerator.unwrap_model(module).backbone, plan.prefix,
                                             self.accelerator.device, self.dist, owner)
        # after a prefix shared across ranks, gradients are averaged by hand once its backward is done
        by_hand = shared is not None and self.dist.world > 1 and torch.is_grad_enabled()
        forwarded = shared.tokens if shared is not None else 0
        for j, planned in enumerate(plan):
            rows, parts = planned if planned is not None else ([self.filler], [self.trees[self.filler]])
            mb = collate(parts, range(len(parts)), attention=self.attention).to(self.accelerator.device)
            if parts[0].prefix:
                mb = shared.attach(mb)
            reduce = self.dist.world == 1 or self.sharded or (j == len(plan) - 1 and not by_hand)
            # DDP decides at the forward whether the backward all-reduces: the caller's forward and
            # backward of this step run while the generator waits here
            with contextlib.nullcontext() if reduce else self.accelerator.no_sync(module):
                yield MicroStep(rows, mb, planned is None, forwarded + (0 if planned is None else mb.n_tokens))
            forwarded = 0
            del mb
            if self.accelerator.device.type == "cpu":
                # The step's activations are freed now, but glibc keeps much of them in its heap, and
                # the next step's differently sized tensors land beside them: without handing them
                # back, resident memory grows with every micro-batch of the step (docs/training.md,
                # "Where a step's memory goes").
                peak_memory.release()
        if shared is not None:
            shared.backward()
        if by_hand:
            self.dist.average_grads(list(module.parameters()))

    def gather(self, per_tree: Sequence[torch.Tensor], step: MicroStep) -> torch.Tensor:
        """The step's trees' token tensors, in label order, on the device: [T_step]."""
        return torch.cat([per_tree[i] for i in step.rows]).to(self.accelerator.device)

    def token_weights(self, per_tree: dict[int, torch.Tensor], step: MicroStep) -> torch.Tensor:
        """The step's aggregation weights; zero on a padding step."""
        w = torch.zeros(self.trees[self.filler].n_trainable) if step.padding else torch.cat([per_tree[i] for i in step.rows])
        return w.to(self.accelerator.device)

    def seq_index(self, step: MicroStep) -> torch.Tensor:
        """[T_step] long: which of the step's trees (0..len(rows)-1) each scored token belongs to."""
        return torch.cat([torch.full((self.trees[i].n_trainable,), j) for j, i in enumerate(step.rows)]).to(self.accelerator.device)

    def backward(self, step: MicroStep, loss: torch.Tensor) -> None:
        """Back-propagate this rank's part of a minibatch loss. Gradients are averaged over ranks, so
        × world makes the ranks' partial sums add up to the loss (`steps` says when they are reduced)."""
        self.accelerator.backward(loss * self.dist.world)

    def score(self, module, plan: RankPlan) -> list[torch.Tensor]:
        """One no-grad pass of `module` over this rank's steps; every rank gets every tree's [T] output.

        Same packing, micro-batches and autocast as the update, so logp_old matches the first update's logp.
        """
        mine: dict[int, torch.Tensor] = {}
        with torch.no_grad(), self.accelerator.autocast():
            for step in self.steps(plan, module):
                out = module(step.batch)
                if step.padding:
                    continue
                out = out[0] if isinstance(out, tuple) else out
                mine.update(zip(step.rows, out.float().cpu().split([self.trees[i].n_trainable for i in step.rows])))
        every = self.dist.gather_dict(mine)
        return [every[i] for i in range(len(self.trees))]
