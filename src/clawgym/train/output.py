"""What `train` writes and how it treats what `--out` already holds: the resume policy, checkpoints, train.jsonl.

`--out` decides where a call starts (`start_point`):

| `--out` holds                      | plain call        | `--resume`            | `--force`   |
|------------------------------------|-------------------|-----------------------|-------------|
| nothing (or an empty directory)    | train             | train                 | train       |
| a complete checkpoint              | refused           | nothing to do         | train anew  |
| an interrupted call's checkpoint   | refused           | continue from it      | train anew  |
| something else                     | refused           | refused               | train anew  |

(`--resume --force` continues an interrupted call and trains anew over a complete one.)

A resumed call must see the same batch of rollouts (`StartPoint.check_batch`); it continues from the
epoch checkpoint's epoch with the logp_old / values saved beside it, and drops the train.jsonl lines
written after that checkpoint (`TrainLog`). `Checkpointer` writes a checkpoint after each epoch
(checkpoint.py; rank 0 writes, every rank waits); `TrainLog` writes one train.jsonl line per update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from rich.console import Console

from clawgym.artifacts import JsonlWriter, MetricsLine, atomic_write_bytes, read_jsonl
from clawgym.errors import UserError
from clawgym.layout import StepLayout
from clawgym.train import checkpoint as ckpt
from clawgym.train import fsdp, lora
from clawgym.train.batch import Scores
from clawgym.train.config import TrainConfig
from clawgym.train.distributed import Dist
from clawgym.train.setup import Models, Ranks
from clawgym.train.step_metrics import reduce_updates
from clawgym.train.update import SkippedStats, UpdateStats


@dataclass
class TrainResult:
    out: Path
    updates: int
    rollouts: int
    trainable_tokens: int
    last: dict[str, float]
    """the last update's train.jsonl line"""
    metrics: dict[str, float] = field(default_factory=dict)
    """the step's train/ metrics: every update's line reduced by step_metrics.REDUCTIONS"""


def metrics_path(cfg: TrainConfig) -> Path:
    """train.jsonl: `--metrics`, or beside trees.parquet."""
    return Path(cfg.metrics) if cfg.metrics else StepLayout(Path(cfg.trees).parent).train_metrics


def result_on_disk(cfg: TrainConfig, state: ckpt.TrainerState) -> TrainResult:
    """The result of a call that trained earlier (or in launched ranks), from its checkpoint and train.jsonl."""
    path = metrics_path(cfg)
    lines = read_jsonl(path).records if path.exists() else []
    return TrainResult(Path(cfg.out), state.updates_done, len(state.rollout_ids), 0, {}, reduce_updates(lines))


@dataclass
class StartPoint:
    """Where this call starts, from what `--out` holds."""

    prior: ckpt.TrainerState | None
    """the checkpoint already in `--out`, if any"""
    resuming: bool
    """continue the interrupted call whose checkpoint `--out` holds"""
    done: bool
    """`--out` holds a complete checkpoint and this call resumes: nothing to do"""

    @property
    def epochs_done(self) -> int:
        return self.prior.epochs_done if self.resuming else 0

    @property
    def updates_done(self) -> int:
        return self.prior.updates_done if self.resuming else 0

    def source(self, cfg: TrainConfig) -> Path:
        """Where the models start: the interrupted call's checkpoint, or the start model."""
        return Path(cfg.out) if self.resuming else Path(cfg.model)

    def check_batch(self, cfg: TrainConfig, rollout_ids: list[str]) -> None:
        if self.resuming and self.prior.rollout_ids != rollout_ids:
            raise UserError(f"{cfg.out}: was written for another batch of rollouts; it cannot be resumed with {cfg.trees}")


def start_point(cfg: TrainConfig, dist: Dist) -> StartPoint:
    """Recover an interrupted save, then apply the table in the module docstring (a refusal is a UserError)."""
    out = Path(cfg.out)
    if dist.main:
        ckpt.recover(out)
    dist.barrier()
    prior = ckpt.load_state(out) if out.exists() else None
    if prior is not None and prior.complete and cfg.resume and not cfg.force:
        return StartPoint(prior, False, True)
    if prior is not None and prior.complete and not cfg.force:
        raise UserError(f"{out}: already holds a complete checkpoint; pass --force to overwrite it")
    if out.exists() and any(out.iterdir()) and prior is None and not cfg.force:
        raise UserError(f"{out}: exists and is not a clawgym checkpoint; choose an empty --out or pass --force")
    if prior is not None and not prior.complete and not cfg.resume and not cfg.force:
        raise UserError(f"{out}: holds an interrupted train call; pass --resume to continue it or --force to restart")
    return StartPoint(prior, cfg.resume and prior is not None and not prior.complete, False)


class Checkpointer:
    """Writes the models to `--out` after an epoch: rank 0 writes, every rank waits for it."""

    def __init__(self, cfg: TrainConfig, ranks: Ranks, models: Models, rollout_ids: list[str], tokenizer_dir: Path):
        self.cfg, self.ranks, self.models = cfg, ranks, models
        self.rollout_ids, self.tokenizer_dir = rollout_ids, tokenizer_dir

    def save(self, epochs_done: int, updates_done: int, scores: Scores | None) -> None:
        cfg, m, accelerator, dist = self.cfg, self.models, self.ranks.accelerator, self.ranks.dist
        # Under FSDP every rank sends its shards to rank 0 first (a collective).
        gathered = fsdp.checkpoint_state(m.policy, m.optimizer, m.value, m.value_optimizer,
                                         bf16=cfg.precision == "bf16") if cfg.fsdp else {}
        # Rank 0 writes; the others wait, so no rank runs ahead of a checkpoint it may resume from.
        if not dist.main:
            dist.barrier()
            return
        state = ckpt.TrainerState(cfg.algo, cfg.epochs, epochs_done, updates_done, epochs_done == cfg.epochs, self.rollout_ids)
        lm = accelerator.unwrap_model(m.policy).lm
        ckpt.save_checkpoint(Path(cfg.out), lm=lm, tokenizer_dir=self.tokenizer_dir,
                             optimizer=gathered.get("optimizer", m.optimizer), state=state, config=cfg,
                             value=accelerator.unwrap_model(m.value) if m.value is not None else None,
                             value_optimizer=gathered.get("value_optimizer", m.value_optimizer),
                             batch_state=scores.state() if scores is not None else None,
                             lm_state=lora.merged_state_dict(lm) if m.adapter is not None else gathered.get("lm_state"),
                             value_state=gathered.get("value_state"), adapter=m.adapter)
        dist.barrier()


class TrainLog:
    """train.jsonl (rank 0 writes it) and the console's line per update; keeps every update's values
    for the step's metrics. A resumed call first drops the lines written after its checkpoint."""

    def __init__(self, cfg: TrainConfig, dist: Dist, console: Console, start: StartPoint):
        self.path, self.console = metrics_path(cfg), console
        self.lines: list[dict] = []  # this call's earlier updates (a resumed call) count in the step's metrics
        if start.resuming and self.path.exists() and dist.main:
            self.lines = [r for r in read_jsonl(self.path).records if r.get("train/update", 0) <= start.updates_done]
            atomic_write_bytes(self.path, b"".join(orjson.dumps(r) + b"\n" for r in self.lines))
        self.writer = JsonlWriter(self.path) if dist.main else None
        self.last: dict[str, float] = {}

    def write(self, stats: UpdateStats) -> None:
        values = stats.metrics()
        self.last = values
        self.lines.append(values)
        if self.writer is None:
            return
        self.writer.append(MetricsLine(int(stats.update), values, time.time()).to_json())
        self.console.print(f"update {int(stats.update)} | loss {stats.loss:.4f} | clip {stats.clip_frac:.3f} | "
                           f"entropy {stats.entropy:.3f} | grad {stats.grad_norm:.3f} | {stats.tokens_per_s:.0f} tok/s forwarded",
                           highlight=False)

    def close(self) -> dict[str, float]:
        """The step's train/ metrics (step_metrics.REDUCTIONS over every update's line)."""
        if self.writer is not None:
            self.writer.close()
        return reduce_updates(self.lines)


def _why_nothing(cfg: TrainConfig, stats: SkippedStats) -> str:
    if cfg.algo == "grpo":
        return (f"all {stats.groups:.0f} GRPO group(s) gave their rollouts one reward each, so no advantage is nonzero: "
                f"equal rewards, or groups of a single rollout ([rollout] group_size or --group-size of 2 or more gives a group a spread)")
    if cfg.algo == "sft":
        return f"no rollout reached --min-reward {cfg.min_reward:g}"
    return "no rollout with a reward and trainable tokens"


def nothing_to_learn(cfg: TrainConfig, checkpointer: Checkpointer, dist: Dist, stats: SkippedStats,
                     console: Console) -> TrainResult:
    """A batch with nothing to learn: the policy is written unchanged so a run can go on, and the metrics say why."""
    out = Path(cfg.out)
    checkpointer.save(cfg.epochs, 0, None)
    if not dist.main:
        return TrainResult(out, 0, 0, 0, {})
    line = MetricsLine(0, stats.metrics(), time.time())
    with JsonlWriter(metrics_path(cfg)) as w:
        w.append(line.to_json())
    console.print(f"nothing to learn ({_why_nothing(cfg, stats)}): wrote the unchanged policy to {out}", highlight=False,
                  soft_wrap=True)
    return TrainResult(out, 0, 0, 0, {}, reduce_updates([line.values]))
