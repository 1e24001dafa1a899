"""Train–inference mismatch: the engine's logprobs of sampled tokens vs the trainer's recomputation.

    clawgym mismatch --calls runs/demo/step-0001/calls.parquet --model models/tiny

The engine that sampled a rollout (vLLM in bf16 with its own kernels, or the hf engine's batched
KV-cache decode) and the trainer (one fp32 forward over the whole sequence) assign slightly
different probabilities to the same token under the same prefix (paper §3.2.4, eq. 9). This
module recomputes, for every sampled token of every successful call, the logprob the trainer
would use as log π_old — a plain transformers forward in fp32 at temperature 1, as
`clawgym.train` scores tokens — and reports per file:

- mean |Δlogp| and max |Δlogp|, with Δlogp = log π_old − log π_rollout;
- k3 KL(π_rollout ‖ π_old) = E[exp(Δ) − Δ − 1] over the sampled tokens (Schulman's k3, the same
  estimator `clawgym.train.losses.k3_kl` logs);
- the fraction of tokens whose ratio exp(Δ) lies outside [0.5, 2] — the tokens whose token-level
  TIS weight min(exp(Δ), C) is far from 1 (C = 2 truncates the upper side).

Calls sampled at a temperature other than 1 carry logprobs of logits / T, which the trainer does
not use; they are counted in the `T≠1` column because their Δ includes that gap.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from clawgym.artifacts import CallRecord, materialize_prompts, read_table
from clawgym.engines.base import load_policy  # noqa: F401 (the trainer's view, re-exported)
from clawgym.errors import UserError
from clawgym.train.losses import k3_kl

LOW, HIGH = 0.5, 2.0


@dataclass(frozen=True)
class Mismatch:
    """The mismatch of one calls file against one checkpoint."""

    label: str
    policy_version: int
    calls: int
    tokens: int
    mean_abs: float
    max_abs: float
    k3_kl: float
    outside: float
    """fraction of tokens with exp(Δlogp) outside [0.5, 2]"""
    hot_calls: int = 0
    """calls sampled at temperature != 1"""


def token_stats(engine_lp: Sequence[float], trainer_lp: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean |Δ|, max |Δ|, mean k3, fraction outside [0.5, 2]) over aligned per-token logprobs."""
    import torch


    if len(engine_lp) != len(trainer_lp):
        raise ValueError(f"{len(engine_lp)} engine logprobs vs {len(trainer_lp)} trainer logprobs")
    if not engine_lp:
        return 0.0, 0.0, 0.0, 0.0
    e = torch.as_tensor(engine_lp, dtype=torch.float64)
    t = torch.as_tensor(trainer_lp, dtype=torch.float64)
    d = t - e
    k3 = k3_kl(logp=e, logp_ref=t)
    ratio = torch.exp(d)
    outside = ((ratio < LOW) | (ratio > HIGH)).double().mean()
    return float(d.abs().mean()), float(d.abs().max()), float(k3.mean()), float(outside)




def trainer_logprobs(model, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> list[float]:
    """log π(output_ids[i] | prompt + output[:i]) at temperature 1, from one fp32 forward."""
    import torch

    if not output_ids:
        return []
    seq = list(prompt_ids) + list(output_ids[:-1])  # the last sampled token predicts nothing we score
    device = next(model.parameters()).device
    with torch.inference_mode():
        # logits_to_keep: only the positions that predict output tokens go through the LM head
        logits = model(input_ids=torch.tensor([seq], device=device), logits_to_keep=len(output_ids)).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, torch.tensor(output_ids, device=device)[:, None]).squeeze(-1).tolist()


def select_calls(calls: list[CallRecord], path: Path, policy_version: int | None, max_calls: int | None) -> tuple[list[CallRecord], int]:
    """Successful calls with output, of one policy version (the only one, or the one asked for)."""
    ok = [c for c in calls if c.status == "ok" and c.output_ids]
    if not ok:
        raise UserError(f"{path} holds no successful call with sampled tokens")
    versions = Counter(c.policy_version for c in ok)
    if policy_version is None:
        if len(versions) > 1:
            listed = ", ".join(f"{v} ({n} calls)" for v, n in sorted(versions.items()))
            raise UserError(f"{path} mixes policy versions {listed}: pick one with --policy-version "
                            f"and pass that version's checkpoint as --model")
        policy_version = next(iter(versions))
    elif policy_version not in versions:
        raise UserError(f"{path} has no call of policy version {policy_version} (has {sorted(versions)})")
    chosen = [c for c in ok if c.policy_version == policy_version]
    chosen.sort(key=lambda c: (c.started_at, c.rollout_id, c.seq))
    return (chosen[:max_calls] if max_calls else chosen), policy_version


def _temperature(c: CallRecord) -> float:
    try:
        t = json.loads(c.sampling_json or "{}").get("temperature")
    except ValueError:
        return 1.0
    return 1.0 if t is None else float(t)


def measure(calls_path: Path, model, *, label: str | None = None, policy_version: int | None = None,
            max_calls: int | None = None) -> Mismatch:
    """Recompute and compare every selected call of one calls.parquet against `model`."""
    calls_path = Path(calls_path)
    if not calls_path.exists():
        raise UserError(f"calls file {calls_path} does not exist")
    calls = read_table(calls_path, CallRecord)
    if any(c.is_delta for c in calls):
        calls = materialize_prompts(calls, calls_path)
    chosen, version = select_calls(calls, calls_path, policy_version, max_calls)
    engine_lp: list[float] = []
    trainer_lp: list[float] = []
    for c in chosen:
        if len(c.output_logprobs) != len(c.output_ids):
            raise UserError(f"{calls_path}: call {c.call_id} has {len(c.output_ids)} ids but {len(c.output_logprobs)} logprobs")
        engine_lp += list(c.output_logprobs)
        trainer_lp += trainer_logprobs(model, c.prompt_ids, c.output_ids)
    if not all(math.isfinite(x) for x in engine_lp):
        raise UserError(f"{calls_path}: some engine logprobs are not finite (was the engine run without logprobs?)")
    mean_abs, max_abs, k3, outside = token_stats(engine_lp, trainer_lp)
    name = label or (calls_path.parent.name if calls_path.name == "calls.parquet" else calls_path.stem)
    return Mismatch(name, version, len(chosen), len(engine_lp), mean_abs, max_abs, k3, outside,
                    sum(1 for c in chosen if abs(_temperature(c) - 1.0) > 1e-6))


def table(rows: Sequence[Mismatch], title: str = "train–inference mismatch"):
    """A rich table of the measurements, one row per calls file."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("calls file", "version", "calls", "tokens", "mean |Δlogp|", "max |Δlogp|", "k3 KL", "ratio ∉ [0.5, 2]", "T≠1"):
        t.add_column(col, justify="left" if col == "calls file" else "right")
    for r in rows:
        t.add_row(r.label, str(r.policy_version), str(r.calls), str(r.tokens), f"{r.mean_abs:.2e}", f"{r.max_abs:.2e}",
                  f"{r.k3_kl:.2e}", f"{r.outside:.2%}", str(r.hot_calls))
    return t


def run_mismatch(calls: Sequence[Path], model_dir: Path, console, *, policy_version: int | None = None,
                 max_calls: int | None = None) -> list[Mismatch]:
    """The `clawgym mismatch` command: measure each calls file against one checkpoint and print the table."""
    if not calls:
        raise UserError("give at least one --calls file")
    model = load_policy(Path(model_dir))
    rows = [measure(Path(p), model, policy_version=policy_version, max_calls=max_calls) for p in calls]
    console.print(table(rows, f"train–inference mismatch against {model_dir} (trainer: transformers fp32, T=1)"))
    return rows
