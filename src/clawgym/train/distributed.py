"""Data parallelism for `train`: which rank trains which trees, matched collectives, launching.

Every rank reads and packs the whole batch (cheap, CPU only) so that the aggregation weights of a
minibatch — the denominators of the token-mean or rollout-mean — are computed over the global
minibatch on every rank alike: no count needs to be all-reduced and the normalization is global
by construction. Each rank then forwards only its own shard of trees:

- `shard` assigns trees to ranks greedily, longest first into the lightest rank (by packed tokens),
  deterministically, so every rank computes the same assignment without talking to the others.
- `padded_plan` splits a rank's part of a minibatch into token-budget micro-batches (group tries
  when prefixes are shared) and pads the
  list with `None` up to the largest count any rank has. A `None` step forwards a small tree with
  weight zero, so every rank makes the same number of forward/backward calls and DDP's gradient
  all-reduce (or FSDP's all-gathers) line up; a zero-weight step adds exactly nothing.
- DDP averages gradients over ranks; the loss is multiplied by the world size (`Dist.world`) so the
  sum of per-rank partial sums is the minibatch's loss, as on one process.

`launch` runs `train` under `accelerate launch` in a subprocess (recipes' `[train] processes = N`);
each rank reads the resolved TrainConfig from a JSON file (`python -m clawgym.train.loop SPEC.json`).
docs/training.md describes the whole scheme.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch

from clawgym.errors import UserError
from clawgym.fields import typed
from clawgym.train.config import TrainConfig

TIMEOUT_S = float(os.environ.get("CLAWGYM_DIST_TIMEOUT_S", "600"))
"""seconds a collective waits for a rank that died or hangs before the step fails"""

T = TypeVar("T")


def shard(sizes: Sequence[int], world: int) -> list[int]:
    """Owner rank of each tree: longest first into the rank with the fewest tokens so far (ties: lowest rank)."""
    owner = [0] * len(sizes)
    load = [0] * world
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return owner


def padded_plan(rows: Sequence[int], owner: Sequence[int], rank: int, world: int,
                planner: Callable[[list[int]], list[T]]) -> list[T | None]:
    """This rank's micro-batches of the global `rows` (`planner` splits one rank's trees into
    micro-batches), padded with None to the largest count any rank has. Every rank plans every
    rank's part, so all agree on the count without talking to each other."""
    return pad([planner([i for i in rows if owner[i] == r]) for r in range(world)], rank)


def pad(plans: Sequence[list[T]], rank: int) -> list[T | None]:
    """`rank`'s plan of every rank's `plans`, padded with None to the longest."""
    n = max(len(p) for p in plans)
    return plans[rank] + [None] * (n - len(plans[rank]))


class Dist:
    """The process group as `train` sees it: rank, world size and the few collectives it needs."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.main = rank == 0

    def gather_dict(self, part: dict[int, Any]) -> dict[int, Any]:
        """Union of every rank's {tree index: value}."""
        if self.world == 1:
            return part
        parts: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(parts, part)
        return {k: v for p in parts for k, v in p.items()}

    def sum(self, values: dict[str, float]) -> dict[str, float]:
        """Each value summed over ranks (float64, so ranks' partial sums add exactly enough)."""
        if self.world == 1:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return dict(zip(keys, t.tolist()))

    def gather_list(self, items: list) -> list:
        if self.world == 1:
            return items
        parts: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(parts, items)
        return [x for p in parts for x in p]

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def broadcast_tensors(self, tensors: list[torch.Tensor] | None, src: int, device: torch.device,
                          extra: Any = None) -> tuple[list[torch.Tensor], Any]:
        """`src`'s `tensors` and `extra` (a small picklable value; the others pass None for both) on every
        rank: their shapes, dtypes and `extra` in one object broadcast, then one flat buffer. `src` keeps
        its own tensors, detached."""
        meta = [([(tuple(t.shape), t.dtype) for t in tensors], extra) if self.rank == src else None]
        torch.distributed.broadcast_object_list(meta, src=src)
        specs, extra = meta[0]
        if self.rank == src:
            flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
        else:
            flat = torch.empty(sum(_numel(shape) for shape, _ in specs), device=device)
        torch.distributed.broadcast(flat, src=src)
        if self.rank == src:
            return [t.detach() for t in tensors], extra
        parts = flat.split([_numel(shape) for shape, _ in specs])
        return [part.reshape(shape).to(dtype) for part, (shape, dtype) in zip(parts, specs)], extra

    def reduce_tensors(self, tensors: list[torch.Tensor], dst: int) -> list[torch.Tensor] | None:
        """The sum over ranks of each of `tensors` (alike in shape on every rank), on `dst`; None elsewhere."""
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        torch.distributed.reduce(flat, dst=dst)
        if self.rank != dst:
            return None
        return [part.reshape(t.shape).to(t.dtype) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]

    def average_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """What DDP's reducer does, by hand: every gradient replaced by its mean over ranks (a missing one counts 0)."""
        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1).float() for p in params])
        torch.distributed.all_reduce(flat)
        flat /= self.world
        for p, part in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(part.reshape(p.grad.shape))


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def accelerator_kwargs() -> list:
    """Kwargs handlers so a collective waiting on a dead rank fails after TIMEOUT_S instead of hanging."""
    from datetime import timedelta

    from accelerate.utils import InitProcessGroupKwargs

    return [InitProcessGroupKwargs(timeout=timedelta(seconds=TIMEOUT_S))]


def write_spec(cfg: Any, path: Path) -> None:
    """The TrainConfig as JSON for the launched ranks, which run it themselves (processes = 1)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    fields.update(processes=1, accelerate_config=None)
    path.write_text(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in fields.items()}))


def launch_command(processes: int, accelerate_config: Path | None = None) -> list[str]:
    """`accelerate launch` with N processes, before the script and its arguments."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes)]
    if accelerate_config is not None:
        cmd += ["--config_file", str(accelerate_config)]
    else:  # DDP over the local GPUs; on a CPU-only machine accelerate makes it gloo CPU ranks (MULTI_CPU)
        cmd += ["--multi_gpu"]
    return cmd


def launch(cfg: Any, processes: int, accelerate_config: Path | None = None) -> None:
    """Run `train(cfg)` in `processes` ranks under `accelerate launch`; a failed rank is one UserError."""
    if processes < 1:
        raise UserError(f"[train] processes must be at least 1, got {processes}")
    fd, spec = tempfile.mkstemp(suffix=".json", prefix="clawgym-train-")
    os.close(fd)
    write_spec(cfg, Path(spec))
    try:
        rc = subprocess.run(launch_command(processes, accelerate_config) + ["-m", "clawgym.train.loop", spec],
                            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}).returncode
    finally:
        os.unlink(spec)
    if rc != 0:
        raise UserError(f"train on {processes} processes failed (exit code {rc}; a rank died or timed out); "
                        f"the last epoch checkpoint in {cfg.out} is kept: rerun with --resume")


def read_spec(path: Path):
    """The TrainConfig `write_spec` wrote."""
    raw = json.loads(Path(path).read_text())
    hints = typing.get_type_hints(TrainConfig)
    return TrainConfig(**{k: typed(v, hints[k], f"{path}: '{k}'") for k, v in raw.items()})
