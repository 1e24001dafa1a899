"""A training step's metrics from its per-update lines: each key's reduction, defined once.

`train()` writes one `train.jsonl` line per optimizer update (minibatch); `clawgym run` writes one
metrics.jsonl line per step. `reduce_updates` turns the first into the `train/` part of the second,
each key by the rule in `REDUCTIONS`: a loss or a fraction is the mean over the step's updates, a
count of forwarded tokens their sum, a per-batch count the sum over one epoch (every epoch covers
the whole batch once), the update counter its last value. Torch-free: `clawgym inspect` reduces
the train.jsonl of a run chained from the shell with the same table.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable, Mapping

REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "mean": statistics.fmean,
    "last": lambda xs: xs[-1],
    "max": max,
}

# train.jsonl key -> how the step's value is made from its updates. "batch" is a sum over the
# updates of one epoch (the last), i.e. over the whole batch once.
REDUCTIONS: dict[str, str] = {
    "train/loss": "mean", "train/pg_loss": "mean", "train/kl_ref": "mean", "train/clip_frac": "mean",
    "train/tis_clip_frac": "mean", "train/entropy": "mean", "train/mismatch_abs": "mean", "train/mismatch_k3": "mean",
    "train/value_loss": "mean", "train/value_mean": "mean", "train/adv_mean": "mean", "train/grad_norm": "mean",
    "train/tokens_per_s": "mean", "train/tree_token_ratio": "mean", "train/tis_seq_ratio": "mean",
    "train/update": "last", "train/epoch": "last", "train/lr": "last", "train/tokens_saved": "last",
    "train/groups": "last", "train/zero_var_groups": "last", "train/processes": "last",
    "train/params": "last", "train/params_per_rank": "last",
    "train/value_warmup_loss_first": "last", "train/value_warmup_loss_last": "last",
    "train/tokens_forwarded": "sum",
    "train/trainable_tokens": "batch", "train/rollouts": "batch",
    "train/grad_norm_max": "max", "train/peak_gib": "max", "train/token_budget": "last",
}
"""Each key's reduction over a step's updates; `train/grad_norm_max` is made from `train/grad_norm`."""

_DERIVED = {"train/grad_norm_max": "train/grad_norm"}


def reduce_updates(lines: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """The step's `train/` values from its train.jsonl lines (dicts as written, `step`/`time` ignored).

    A key missing from `REDUCTIONS` is a ValueError: a new per-update metric must say how it sums up.
    """
    lines = list(lines)
    last_epoch = max((float(r.get("train/epoch", 0.0)) for r in lines), default=0.0)  # type: ignore[arg-type]
    out: dict[str, float] = {}
    keys = sorted({k for r in lines for k in r if k not in ("step", "time")})
    for key in keys:
        rule = REDUCTIONS.get(key)
        if rule is None:
            raise ValueError(f"train metric {key!r} has no reduction; add it to clawgym.train.step_metrics.REDUCTIONS")
        rows = [r for r in lines if rule != "batch" or float(r.get("train/epoch", 0.0)) == last_epoch]  # type: ignore[arg-type]
        nums = [float(r[key]) for r in rows if _number(r.get(key))]  # type: ignore[arg-type]
        if nums:
            out[key] = REDUCERS["sum" if rule == "batch" else rule](nums)
    for key, source in _DERIVED.items():
        nums = [float(r[source]) for r in lines if _number(r.get(source))]  # type: ignore[arg-type]
        if nums:
            out[key] = REDUCERS[REDUCTIONS[key]](nums)
    return out


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
