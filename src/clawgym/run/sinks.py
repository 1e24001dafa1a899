"""Metrics sinks beside metrics.jsonl: TensorBoard and Weights & Biases, each an optional extra.

metrics.jsonl is the run's source of truth: the loop appends a step's line there first, then hands
the same line to every sink a recipe's `[log]` section turns on. A sink that fails to start names
the extra to install; nothing it writes leaves the run directory (W&B runs offline by default and
keeps its cache, config and run folders under RUN/wandb).

    [log]
    tensorboard = true                                  # RUN/tensorboard/events.out.tfevents.*
    wandb = {project = "clawgym", mode = "offline"}     # RUN/wandb/offline-run-*/run-*.wandb

A new sink is a class with `write(line)` and `close()` (the `Sink` protocol) and an entry in `SINKS`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Protocol

from clawgym.artifacts import MetricsLine
from clawgym.errors import UserError
from clawgym.layout import RunLayout


class Sink(Protocol):
    def write(self, line: MetricsLine) -> None: ...

    def close(self) -> None: ...


WANDB_KEYS = {"project": str, "mode": str, "entity": str, "name": str, "group": str, "tags": list}
WANDB_MODES = ("offline", "online", "disabled")


def _missing(extra: str, package: str, e: ImportError) -> UserError:
    return UserError(f"[log] {extra} needs the {package} package ({e.msg}): pip install 'clawgym[{extra}]'")


class TensorBoardSink:
    """Scalars under their metrics.jsonl keys (rollout/reward_mean, train/loss, ...), x = the step."""

    def __init__(self, run: RunLayout, first_step: int):
        try:
            import tensorboard  # noqa: F401  (torch's writer needs it; fail with the extra's name first)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise _missing("tensorboard", "tensorboard", e) from None
        # purge_step: a resumed run drops the events a killed one wrote from its first re-run step on
        self.writer = SummaryWriter(log_dir=str(run.tensorboard), purge_step=first_step if first_step > 1 else None)

    def write(self, line: MetricsLine) -> None:
        for key, value in line.values.items():
            self.writer.add_scalar(key, float(value), global_step=line.step, walltime=line.time or None)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run per `clawgym run` process, logged at the loop's step numbers, the recipe as its config."""

    def __init__(self, run: RunLayout, options: dict[str, Any], name: str, config: dict[str, Any]):
        try:
            import wandb
        except ImportError as e:
            raise _missing("wandb", "wandb", e) from None
        folder = run.wandb
        folder.mkdir(parents=True, exist_ok=True)
        # W&B keeps caches and settings under the home directory unless told otherwise: keep them in the run.
        for var, sub in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"), ("WANDB_DATA_DIR", "data"),
                         ("WANDB_ARTIFACT_DIR", "artifacts")):
            os.environ[var] = str(folder / sub)
        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_machine_info=True)
        self.wandb = wandb
        self.run = wandb.init(project=options["project"], entity=options.get("entity"), name=options.get("name", name),
                              group=options.get("group"), tags=options.get("tags"), mode=options.get("mode", "offline"),
                              dir=str(run.root), config=config, settings=settings, reinit="create_new")

    def write(self, line: MetricsLine) -> None:
        self.run.log(dict(line.values), step=line.step)

    def close(self) -> None:
        self.run.finish()
        # finish() returns before W&B's service has written everything; teardown waits for it, so
        # the offline run folder is complete (ready for `wandb sync`) when the loop returns.
        self.wandb.teardown()


def check_wandb_options(options: dict[str, Any], where: str) -> None:
    """A recipe's `[log] wandb` table: known keys of the right type, a project, a known mode."""
    for key, value in options.items():
        kind = WANDB_KEYS.get(key)
        if kind is None:
            raise UserError(f"{where} key 'wandb': unknown key '{key}'; known: {', '.join(sorted(WANDB_KEYS))}")
        if not isinstance(value, kind):
            raise UserError(f"{where} key 'wandb.{key}' must be {kind.__name__}, got {type(value).__name__} {value!r}")
    if options and "project" not in options:
        raise UserError(f"{where} key 'wandb' needs a project, e.g. wandb = {{project = \"clawgym\", mode = \"offline\"}}")
    if options.get("mode", "offline") not in WANDB_MODES:
        raise UserError(f"{where} key 'wandb.mode' must be one of {', '.join(WANDB_MODES)}, got {options['mode']!r}")


SINKS: dict[str, Callable[..., Sink]] = {"tensorboard": TensorBoardSink, "wandb": WandbSink}


def open_sinks(run: RunLayout, *, tensorboard: bool, wandb: dict[str, Any], name: str, first_step: int,
               config: dict[str, Any]) -> list[Sink]:
    """The sinks a recipe's [log] turns on, started now (so a missing extra fails before any work)."""
    sinks: list[Sink] = []
    try:
        if tensorboard:
            sinks.append(SINKS["tensorboard"](run, first_step))
        if wandb:
            sinks.append(SINKS["wandb"](run, wandb, name, config))
    except BaseException:
        close_sinks(sinks)
        raise
    return sinks


def close_sinks(sinks: list[Sink]) -> None:
    for sink in sinks:
        sink.close()
