"""Checkpoints: HF-format policy + tokenizer + generation config, optimizer state, trainer progress.

A checkpoint directory is loadable by `AutoModelForCausalLM.from_pretrained` and by the serving
engines as is. Beside the HF files it holds:

    optimizer.pt          the policy optimizer's state (AdamW moments), reused by the next step
    trainer_state.json    progress of the `train` call that wrote it (TrainerState)
    batch_state.pt        only while incomplete: logp_old / values of the batch, for --resume
    train_config.json     the resolved TrainConfig
    value/                PPO only: the value model (see value.py) and its optimizer.pt
    adapter/              LoRA only: the adapter in peft format (lora.py); the HF weights have it merged

Saving is atomic: everything is written to a sibling temp directory, then swapped in by renames.
The previous checkpoint is moved aside (`NAME.old-PID`) for the instant between the two renames;
`recover` puts it back if a kill lands exactly there, so some complete checkpoint is always
loadable. A kill at any other moment leaves only a `.tmp-` directory, which is ignored and removed.
A full disk is reported as one `ArtifactError` naming the checkpoint; the previous one is unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from clawgym.artifacts import ArtifactError, no_space, umask_modes, write_config
from clawgym.errors import UserError
from clawgym.train.lora import ADAPTER_DIR
from clawgym.train.value import VALUE_DIR

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
BATCH_FILE = "batch_state.pt"


@dataclass
class TrainerState:
    """How far the `train` call that wrote a checkpoint got."""

    algo: str
    epochs: int
    epochs_done: int
    updates_done: int
    complete: bool
    rollout_ids: list[str]
    """the packed rollouts of the batch, in order; a resume must see the same batch"""


def recover(out: Path) -> None:
    """Undo a save interrupted between its two renames, and drop abandoned temp directories."""
    out = Path(out)
    olds = sorted(out.parent.glob(f"{out.name}.old-*")) if out.parent.exists() else []
    if not out.exists() and olds:
        os.replace(olds[-1], out)
        olds = olds[:-1]
    for stale in [*olds, *(out.parent.glob(f".{out.name}.tmp-*") if out.parent.exists() else [])]:
        shutil.rmtree(stale, ignore_errors=True)


def save_checkpoint(
    out: Path,
    *,
    lm: torch.nn.Module,
    tokenizer_dir: Path,
    optimizer: torch.optim.Optimizer | dict,
    state: TrainerState,
    config: Any,
    value: torch.nn.Module | None = None,
    value_optimizer: torch.optim.Optimizer | dict | None = None,
    value_state: dict[str, torch.Tensor] | None = None,
    batch_state: dict | None = None,
    lm_state: dict[str, torch.Tensor] | None = None,
    adapter: Any = None,
) -> Path:
    """Write a complete checkpoint to `out`, atomically replacing any previous one.

    `lm_state` replaces the LM's own state dict (LoRA: the merged weights; FSDP: the gathered
    weights), `value_state` the value model's; `adapter` is a peft model whose adapter is saved
    beside them. An optimizer may be given as its state dict (FSDP: gathered by fsdp.full_state).
    """
    from transformers import AutoTokenizer

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        lm.save_pretrained(tmp, safe_serialization=True, state_dict=lm_state)
        if adapter is not None:
            adapter.save_pretrained(tmp / ADAPTER_DIR)
        if lm.generation_config is not None and not (tmp / "generation_config.json").exists():
            lm.generation_config.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(tmp)
        torch.save(_state_dict(optimizer), tmp / OPTIMIZER_FILE)
        if value is not None:
            value.save(tmp / VALUE_DIR, value_state)
            if value_optimizer is not None:
                torch.save(_state_dict(value_optimizer), tmp / VALUE_DIR / OPTIMIZER_FILE)
        if batch_state is not None and not state.complete:
            torch.save(batch_state, tmp / BATCH_FILE)
        write_config(tmp / "train_config.json", config)
        # The state file is written last: its presence marks the temp directory as complete.
        (tmp / STATE_FILE).write_text(json.dumps(dataclasses.asdict(state), indent=2) + "\n")
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        umask_modes(tmp)  # mkdtemp made it 0700: the checkpoint takes the umask's modes, as any output
    except BaseException as e:
        full = no_space(e, tmp)  # measured before the partial files are removed
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise ArtifactError(out, None, f"could not be written: no space left on device "
                                           f"({shutil.disk_usage(out.parent).free >> 20} MiB free once the partial "
                                           f"files were removed); any previous checkpoint there is unchanged") from e
        raise
    old = out.parent / f"{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def _state_dict(optimizer: torch.optim.Optimizer | dict) -> dict:
    return optimizer if isinstance(optimizer, dict) else optimizer.state_dict()


def load_state(path: Path) -> TrainerState | None:
    """The TrainerState of a checkpoint directory, or None if it is not one written by `train`."""
    f = Path(path) / STATE_FILE
    if not f.exists():
        return None
    try:
        raw = json.loads(f.read_text())
        return TrainerState(**{k: raw[k] for k in (fld.name for fld in dataclasses.fields(TrainerState))})
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{f}: not a clawgym trainer state ({e})") from None


def is_complete(path: Path) -> bool:
    """Whether `path` holds a complete checkpoint (its state file says so)."""
    state = load_state(path) if path.is_dir() else None
    return state is not None and state.complete


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path, apply: Callable[[dict], None] | None = None) -> bool:
    """Load optimizer state saved beside a checkpoint if there is one; True if loaded.

    `apply` puts the state into the optimizer (default: its `load_state_dict`; FSDP: fsdp.load_optimizer).
    A state for another parameter layout (a different model) is an error, not silently skipped.
    """
    path = Path(path)
    if not path.exists():
        return False
    # A saved state carries its call's hyperparameters (lr, betas, ...) in its param groups, and
    # load_state_dict would put them back: an RL step after an SFT cold start would then train at the
    # cold start's lr whatever its own --lr. The moments and step counts carry over; the
    # hyperparameters stay this call's.
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        (apply or optimizer.load_state_dict)(torch.load(path, map_location="cpu", weights_only=True))
    except (ValueError, RuntimeError, KeyError) as e:
        raise UserError(f"{path}: optimizer state does not fit this model ({e})") from None
    for group, mine in zip(optimizer.param_groups, hyper):
        group.update(mine)
    return True


def load_batch_state(path: Path) -> dict:
    f = Path(path) / BATCH_FILE
    if not f.exists():
        raise UserError(f"{f}: missing; the checkpoint cannot be resumed mid-call")
    return torch.load(f, map_location="cpu", weights_only=True)
