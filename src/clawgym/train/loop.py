"""`clawgym train`: GRPO, PPO or SFT over packed prefix trees, in one function read top to bottom.

    clawgym train runs/demo/step-0001 --model models/tiny --out runs/demo/checkpoints/step-0001

`train` shows the algorithm's phases in order; each phase's machinery lives in its own module:

| phase                                                   | module                                  |
|---------------------------------------------------------|-----------------------------------------|
| what `--out` holds: start, resume or refuse; checkpoints, train.jsonl | output.py                 |
| accelerator, policy (LoRA, bf16 + fp32 masters, FSDP), value model, optimizers | setup.py         |
| rollouts chosen with their signal per algorithm, packed trees, advantages, minibatches | batch.py |
| this rank's micro-batches: token budget, padding steps, `no_sync`          | microbatches.py      |
| the plan's expected peak against the memory this process can have          | memory_guard.py      |
| one optimizer update and its metrics (`UpdateStats`)                       | update.py            |

The math lives in `losses.py`, the packing in `packing.py` and `attention.py` (paper §2.3,
§3.2.3–3.2.4; docs/models.md). CPU runs fp32 with per-segment SDPA; CUDA runs bf16 autocast with
FlexAttention (a mask_mod over node ids, O(L) memory). accelerate places the models and wraps them
for `accelerate launch` (DDP, or FSDP2 with `--fsdp`: fsdp.py); the trees are sharded across
processes by token count and the loss normalization is global (distributed.py; docs/training.md),
and rank 0 alone writes checkpoints and metrics. `[train] processes = N` launches the ranks itself.
1 vs 2 processes (DDP and FSDP) is tested on CPU with gloo.
"""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console

from clawgym import console as shared_console
from clawgym.errors import UserError
from clawgym.train import checkpoint as ckpt
from clawgym.train import memory, memory_guard, output, prefix, setup
from clawgym.train.batch import Scores, choose, minibatches, pack, token_advantages
from clawgym.train.config import TrainConfig
from clawgym.train.cpu_phases import CpuPhases
from clawgym.train.distributed import launch, read_spec
from clawgym.train.microbatches import RankMicroBatches
from clawgym.train.output import TrainResult
from clawgym.train.update import SkippedStats, update, warm_up_value

__all__ = ["TrainConfig", "TrainResult", "train", "main"]


def train(cfg: TrainConfig, console: Console | None = None) -> TrainResult:
    """Train on one step's trees; progress lines go to `console` (default stderr; `clawgym run`'s is quiet)."""
    cfg.validate()
    setup.check_environment(cfg)
    console = console or shared_console.STDERR
    if setup.needs_launch(cfg):  # not yet inside a launched rank: launch them, read back what rank 0 wrote
        launch(cfg, cfg.processes, cfg.accelerate_config)
        return output.result_on_disk(cfg, ckpt.load_state(cfg.out))
    ranks = setup.start_ranks(cfg)
    cpu = CpuPhases()  # each rank's CPU seconds per phase, written for bench/data_parallel.py (cpu_phases.py)
    start = output.start_point(cfg, ranks.dist)
    if start.done:  # a resumed run (`clawgym run` after a kill) finds this step already trained
        console.print(f"{cfg.out}: already complete ({start.prior.updates_done} updates); nothing to resume", highlight=False)
        return output.result_on_disk(cfg, start.prior)
    torch.manual_seed(cfg.seed)
    cpu.enter("batch")

    # 1-2) Load the step's trees and rollouts; choose rollouts and their signal (GRPO advantages
    #      per group, PPO returns, SFT reward filter).
    chosen = choose(cfg)
    start.check_batch(cfg, chosen.rollout_ids)
    # 3) Pack each chosen rollout's tree into one sequence.
    batch = pack(cfg, chosen)
    # 4) Models and optimizers, placed by accelerate; resumed, or the previous step's optimizer state reused.
    cpu.enter("models")
    models = setup.load_models(cfg, ranks, start.source(cfg), start.resuming)
    checkpointer = output.Checkpointer(cfg, ranks, models, chosen.rollout_ids, tokenizer_dir=start.source(cfg))
    if not batch.trees:
        skipped = SkippedStats(rollouts=0.0, zero_var_groups=float(chosen.zero_var_groups), groups=float(chosen.groups))
        return output.nothing_to_learn(cfg, checkpointer, ranks.dist, skipped, console)
    if ranks.dist.main:  # said once the models are loaded and checked, so a refused architecture or option is the only line
        console.print(batch.summary(cfg.algo, ranks.dist.world), highlight=False)
        console.print(memory.estimate_line(memory.shape_of(models.model_config), cfg, ranks.dist.world), highlight=False)
    # A prompt the minibatch's trees share is forwarded once per optimizer step, for all ranks (prefix.py);
    # where it cannot be (FSDP on several processes, sliding windows), once per micro-batch, and the run says so.
    cpu.enter("plan")
    once_per_micro_batch = prefix.unavailable(ranks.dist.world, models.model_config, cfg.fsdp) if cfg.share_prefixes else None
    if once_per_micro_batch and ranks.dist.main:
        console.print(once_per_micro_batch, highlight=False)
    micro = RankMicroBatches(batch.trees, ranks.dist, ranks.accelerator, token_budget=cfg.token_budget,
                             share_prefixes=cfg.share_prefixes, attention=models.attention, sharded=cfg.fsdp,
                             step_prefix=once_per_micro_batch is None)
    # The plan's expected peak must fit the memory this process can have: planned again with smaller
    # micro-batches, or refused in one line, before anything is written (memory_guard.py).
    whole = memory_guard.fit(cfg, micro, range(len(batch.trees)), memory.shape_of(models.model_config),
                             optimizer_ready=bool(models.optimizer.state), ppo=models.value is not None,
                             say=lambda line: ranks.dist.main and console.print(line, highlight=False))

    # 5) logp_old (and logp_ref) from the same packed forward as the updates, before any update.
    cpu.enter("score")
    if start.resuming:
        scores = Scores.from_state(ckpt.load_batch_state(cfg.out))
    else:
        scores = Scores(logp_old=micro.score(models.policy, whole))
        if cfg.kl_coef > 0:
            scores.logp_ref = micro.score(setup.load_reference(cfg, models, ranks.accelerator.device), whole)

    # 6) [PPO] The value model is fitted before the policy moves, then A_t = R − V(s_t), whitened
    #    over the batch. GRPO and SFT: the rollout's signal on every token.
    warmup_losses: list[float] = []
    if models.value is not None and not start.resuming:
        warmup_losses, scores.values = warm_up_value(models, batch, micro, whole, cfg)
    advantages = token_advantages(batch, scores, cfg)

    # 7) Epochs × minibatches of clipped updates, each one optimizer step accumulated over micro-batches;
    # 8) one train.jsonl line per update; 9) a checkpoint per epoch, the last one complete.
    log = output.TrainLog(cfg, ranks.dist, console, start)
    updates_done = start.updates_done
    for epoch in range(start.epochs_done, cfg.epochs):
        cpu.enter("updates")
        for rows in minibatches(len(batch.trees), cfg, epoch):
            updates_done += 1
            stats = update(models, batch, scores, advantages, micro, rows, cfg,
                           number=updates_done, epoch=epoch, warmup_losses=warmup_losses)
            log.write(stats)
        cpu.enter("checkpoint")
        checkpointer.save(epoch + 1, updates_done, scores)
    step_metrics = log.close()
    cpu.write(ranks.dist.rank)
    return TrainResult(Path(cfg.out), updates_done, len(batch.trees), batch.trainable_tokens, log.last, step_metrics)


def main(argv: list[str]) -> int:
    """A launched rank: `python -m clawgym.train.loop SPEC.json` (distributed.launch starts N of them)."""
    import sys

    try:
        train(read_spec(Path(argv[0])))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
