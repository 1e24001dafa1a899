"""A run's metrics: the names of the keys of metrics.jsonl, and how a step's line is made from its files.

Names. A step's metrics line is written by several stages; this module is the one list of its
names. The `rollout/`, `proxy/`, `eval/` and `time/` keys are declared here and used by name (the
loop, the cold start, the console's step line); the `train/` keys are those of
`train.step_metrics.REDUCTIONS` (each with its rule for summing a step's updates) and the `trees/`
keys those of `trees.stats`; `FAMILIES` says which prefix each module owns, and
`tests/test_cli_edges.py` checks that every key a step writes is one of them.

Aggregation. `step_values` makes a step's line from the step's folder: `rollout_values` from
rollouts.parquet and calls.parquet, `trees_values` from the line build-trees wrote, `train_values`
from train.jsonl reduced by `train.step_metrics.reduce_updates`; the loop adds the engine's
prefix-cache figures and forward times (`engine_values`) and the phase times (`PHASES`). `clawgym inspect` of a run
chained from the shell makes the same line from the same files; `cold_start_values` makes the
step-0 line of an [sft] cold start.

Units: in files (metrics.jsonl, eval.json, `--json`) rewards, Pass@1 and every fraction are in
[0, 1]; what a person reads shows Pass@1 in % everywhere (step lines, `eval`, `compare` and `inspect`
tables, plots) and says "%"; a std is the sample standard deviation (n − 1), as `torch.std` gives TRL's `reward_std`;
lengths are in tokens; times in seconds. docs/recipes.md ("Metric names") has the table of `PEERS`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from clawgym import artifacts as A
from clawgym.train.staleness import call_versions, stale_groups
from clawgym.train.step_metrics import reduce_updates

if TYPE_CHECKING:
    from clawgym.artifacts import RolloutRecord
    from clawgym.layout import RunLayout, StepLayout

REWARD_MEAN = "rollout/reward_mean"
"""mean reward over the step's scored rollouts (REWARD_MEAN/HARNESS: over one harness's)"""
REWARD_STD = "rollout/reward_std"
"""sample std (n − 1) of those rewards; 0 with fewer than two"""
RESPONSE_LENGTH_MEAN = "rollout/response_length_mean"
"""tokens the policy sampled in a rollout (all its model calls), mean over the step's rollouts"""
RESPONSE_LENGTH_MAX = "rollout/response_length_max"
TURNS_MEAN = "rollout/turns_mean"
"""model calls per rollout (the agent's turns), mean over the step's rollouts"""
TURNS_MAX = "rollout/turns_max"
ROLLOUTS = "rollout/n"
INFRA_ERRORS = "rollout/infra_error"
CHECK_ERRORS = "rollout/check_error"
"""rollouts whose task check crashed (no reward, left out like infra errors)"""
TIMEOUTS = "rollout/timeout"
PREFIX_HIT_RATE = "proxy/prefix_hit_rate"
"""share of the step's prompt tokens whose keys and values the engine's prefix cache served (docs/engines.md)"""
PROMPT_COMPUTED_SHARE = "proxy/prompt_computed_share"
"""share of the step's prompt tokens the engine ran a forward over (1.0 without a cache)"""
PREFILL_SECONDS = "proxy/prefill_s"
"""seconds of the engine's prompt forwards during the step's rollouts"""
DECODE_SECONDS = "proxy/decode_s"
"""seconds of its decode steps during them"""
DECODE_TOKENS_PER_S = "proxy/decode_tok_s"
"""tokens its decode steps sampled per second of decode: the engine's decode speed over the step"""
VERSION_MIN = "rollout/policy_version_min"
"""an asynchronous run ([run] max_staleness >= 1): the oldest policy version among the step's calls"""
VERSION_MAX = "rollout/policy_version_max"
"""and the newest"""
STALENESS_MAX = "rollout/staleness_max"
"""how many versions the step's oldest call lags the weights it trains (the bound's measure)"""
STALE_GROUPS = "rollout/stale_groups"
"""the step's groups left out of training whole: a call older than max_staleness versions"""
GROUPS = "rollout/groups"
"""the step's groups (task–harness pairs) that had a scored rollout"""
EVAL = "eval/"
"""prefix of the keys of an evaluation (`eval.EvalReport.metrics`, each key under it)"""
PASS_AT_1 = "eval/pass@1"
"""held-out Pass@1, a fraction: the mean over tasks of each task's mean score over its samples"""

# the step-0 line of an [sft] cold start
TEACHER_N = "rollout/teacher_n"
"""teacher trajectories collected"""
TEACHER_REWARD_MEAN = "rollout/teacher_reward_mean"
"""their mean reward (over the scored ones)"""
SFT_LOSS_FIRST = "train/sft_loss_first"
SFT_LOSS_LAST = "train/sft_loss_last"
EVAL_BASE = "eval/base/"
"""prefix of the starting policy's evaluation before the cold start (the SFT policy's is under `EVAL`)"""

ROLLOUT_KEYS = (ROLLOUTS, REWARD_MEAN, REWARD_STD, INFRA_ERRORS, CHECK_ERRORS, TIMEOUTS, RESPONSE_LENGTH_MEAN, RESPONSE_LENGTH_MAX,
                TURNS_MEAN, TURNS_MAX)
PROXY_KEYS = (PREFIX_HIT_RATE, PROMPT_COMPUTED_SHARE, PREFILL_SECONDS, DECODE_SECONDS, DECODE_TOKENS_PER_S)
COLD_START_KEYS = (TEACHER_N, TEACHER_REWARD_MEAN, SFT_LOSS_FIRST, SFT_LOSS_LAST)

ENGINE_COUNTERS = ("prompt_tokens", "prompt_tokens_cached", "prompt_tokens_computed", "prefill_seconds", "decode_seconds",
                   "decode_tokens")
"""the engine's cumulative counters (its /admin/engine stats) that `engine_values` reads"""


@dataclass(frozen=True)
class Phase:
    """One phase of a loop step: the metrics key of its seconds and its names on the console."""

    key: str
    label: str
    """its name among the step line's timings"""
    doing: str
    """its name beside the progress bar while it runs"""

    @property
    def peak_key(self) -> str:
        """metrics key of the process's peak resident memory during the phase, GiB (peak_memory.py)"""
        return "memory/" + self.key.removeprefix("time/").removesuffix("_s") + "_peak_gib"


COLLECT = Phase("time/collect_s", "rollout", "rollouts")
RECONSTRUCT = Phase("time/reconstruct_s", "trees", "trees")
OPTIMIZE = Phase("time/optimize_s", "train", "train")
SYNC = Phase("time/sync_s", "sync", "sync")
EVALUATE = Phase("time/eval_s", "eval", "eval")
PHASES = (COLLECT, RECONSTRUCT, OPTIMIZE, SYNC, EVALUATE)
"""a step's phases in pipeline order"""
STEP_SECONDS = "time/step_s"
"""seconds of the whole step"""
COLD_START_PHASES = (Phase("time/base_eval_s", "base eval", "base eval"), Phase("time/teach_s", "teacher", "teacher"),
                     Phase("time/sft_s", "sft", "sft"), Phase("time/sft_eval_s", "sft eval", "sft eval"))
"""the cold start's stages (coldstart.py) whose seconds the step-0 line reports; tree building is in `sft`"""

FAMILIES = {
    f"{REWARD_MEAN}/": "metrics.rollout_values: the mean reward of one harness (rollout/reward_mean/HARNESS)",
    "trees/": "trees.stats.TreeStats.to_metrics",
    "train/": "train.step_metrics.REDUCTIONS",
    EVAL: "metrics.eval_figures (eval/pass@1, eval/pass@1/CATEGORY, eval/excluded, eval/HARNESS/... through several "
          "harnesses; eval/base/ before an [sft] cold start)",
    "time/": "metrics.PHASES: seconds per phase (collect, reconstruct, optimize, sync, eval) and per step; "
             "metrics.COLD_START_PHASES: seconds per cold-start stage (step 0)",
    "memory/": "metrics.Phase.peak_key: the process's peak resident GiB during each phase and cold-start stage",
}
"""key prefixes whose names another module owns, and which"""

PEERS = {
    REWARD_MEAN: ("reward", "critic/score/mean"),
    REWARD_STD: ("reward_std", "-"),
    RESPONSE_LENGTH_MEAN: ("completions/mean_length", "response_length/mean"),
    RESPONSE_LENGTH_MAX: ("completions/max_length", "response_length/max"),
    TURNS_MEAN: ("-", "num_turns/mean"),
    "train/loss": ("loss", "actor/pg_loss (+ value and KL terms)"),
    "train/entropy": ("entropy", "actor/entropy"),
    "train/kl_ref": ("kl", "actor/kl_loss"),
    "train/clip_frac": ("clip_ratio/region_mean", "actor/pg_clipfrac"),
    "train/grad_norm": ("grad_norm", "actor/grad_norm"),
    "train/lr": ("learning_rate", "actor/lr"),
    "train/mismatch_k3": ("-", "training/rollout_probs_diff (a related measure)"),
    PASS_AT_1: ("-", "val-core/.../acc (per data source)"),
    STEP_SECONDS: ("-", "timing_s/step"),
}
"""clawgym key -> (TRL's GRPOTrainer log name, verl's), "-" where the peer logs none"""


def is_known(key: str) -> bool:
    """Whether `key` is declared here or lies in a family another module owns."""
    return (key in ROLLOUT_KEYS or key in PROXY_KEYS or key in COLD_START_KEYS or key == PASS_AT_1
            or any(key.startswith(prefix) for prefix in FAMILIES))


# ---------------------------------------------------------------------------------------------
# A step's line from its files. The artifacts module (pyarrow) is imported where a file is read,
# so the console and the command line, which use the names above, start without it.


def reward_mean(rollouts: Sequence[RolloutRecord]) -> float:
    """The mean reward over the scored rollouts; 0.0 when none was scored."""
    scored = [r.reward for r in rollouts if r.reward is not None]
    return statistics.fmean(scored) if scored else 0.0


def rollout_values(sdir: StepLayout) -> dict[str, float]:
    """The rollout/ numbers of a step, from its rollouts.parquet and calls.parquet."""
    rollouts = A.read_table(sdir.rollouts, A.RolloutRecord)
    scored = [r.reward for r in rollouts if r.reward is not None]
    lengths = _response_lengths(sdir, [r.rollout_id for r in rollouts])
    turns = [r.n_calls for r in rollouts]
    values: dict[str, float] = {
        ROLLOUTS: len(rollouts),
        REWARD_MEAN: reward_mean(rollouts),
        REWARD_STD: statistics.stdev(scored) if len(scored) > 1 else 0.0,  # sample std, as `rollout --json` and TRL
        INFRA_ERRORS: sum(r.status == "infra_error" for r in rollouts),
        CHECK_ERRORS: sum(r.status == "check_error" for r in rollouts),
        TIMEOUTS: sum(r.status == "timeout" for r in rollouts),
        RESPONSE_LENGTH_MEAN: statistics.fmean(lengths) if lengths else 0.0,
        RESPONSE_LENGTH_MAX: max(lengths, default=0),
        TURNS_MEAN: statistics.fmean(turns) if turns else 0.0,
        TURNS_MAX: max(turns, default=0),
    }
    for h in sorted({r.harness for r in rollouts}):
        values[f"{REWARD_MEAN}/{h}"] = reward_mean([r for r in rollouts if r.harness == h])
    return values


def _response_lengths(sdir: StepLayout, rollout_ids: list[str]) -> list[int]:
    """Tokens each rollout's model calls sampled, in all (from calls.parquet's output_ids, read alone)."""
    if not sdir.calls.exists():
        return []
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(sdir.calls, columns=["rollout_id", "output_ids"])
    per_call = pc.list_value_length(table.column("output_ids")).to_pylist()
    totals = dict.fromkeys(rollout_ids, 0)
    for rid, n in zip(table.column("rollout_id").to_pylist(), per_call):
        if rid in totals:
            totals[rid] += n or 0
    return list(totals.values())


def engine_values(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """A step's prefix-cache figures and forward times from the engine's `ENGINE_COUNTERS` around its
    rollouts (docs/engines.md); only those the engine reports ({} for an engine with none)."""
    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    values: dict[str, float] = {}
    sent = after.get("prompt_tokens", 0.0) - before.get("prompt_tokens", 0.0)
    if sent > 0 and "prompt_tokens_cached" in after:
        values |= {PREFIX_HIT_RATE: delta("prompt_tokens_cached") / sent, PROMPT_COMPUTED_SHARE: delta("prompt_tokens_computed") / sent}
    if "prefill_seconds" in after and "decode_seconds" in after:
        values |= {PREFILL_SECONDS: delta("prefill_seconds"), DECODE_SECONDS: delta("decode_seconds")}
        if values[DECODE_SECONDS] > 0 and "decode_tokens" in after:
            values[DECODE_TOKENS_PER_S] = delta("decode_tokens") / values[DECODE_SECONDS]
    return values


def trees_values(sdir: StepLayout) -> dict[str, float]:
    """The trees/ numbers of a step: the line build-trees wrote."""
    return dict(A.read_metrics(sdir.trees_metrics)[-1].values) if sdir.trees_metrics.exists() else {}


def train_values(sdir: StepLayout) -> dict[str, float]:
    """The train/ numbers of a trained step: its train.jsonl lines reduced by the table `train()` uses
    (train/step_metrics.py), the figures `train()` returns for a step it finds already complete."""
    return reduce_updates(A.read_jsonl(sdir.train_metrics).records) if sdir.train_metrics.exists() else {}


def eval_figures(doc: Mapping) -> dict[str, float]:
    """An evaluation's figures from its eval.json document (`eval.EvalReport.to_json`): pass@1,
    excluded, pass@1/CATEGORY, and through several harnesses the same again as HARNESS/pass@1..."""
    def flat(d: Mapping) -> dict[str, float]:
        return {"pass@1": d["pass@1"], "excluded": float(d.get("excluded", 0)),
                **{f"pass@1/{c}": v for c, v in d["per_category"].items()}}

    out = flat(doc)
    for harness, sub in doc.get("per_harness", {}).items():
        out.update({f"{harness}/{k}": v for k, v in flat(sub).items()})
    return out


def eval_values(report: Mapping[str, float], prefix: str = EVAL) -> dict[str, float]:
    """An evaluation's figures (`EvalReport.metrics()`, or eval.json's) as metrics keys under `prefix`."""
    return {f"{prefix}{k}": v for k, v in report.items()}


def step_values(sdir: StepLayout, *, engine: Mapping[str, float] | None = None, train: Mapping[str, float] | None = None,
                times: Mapping[str, float] | None = None) -> dict[str, float]:
    """A step's line, in the order metrics.jsonl holds it: rollout/, the engine's proxy/ figures,
    trees/, train/ (`train`: what this process's `train()` returned; None: from the step's
    train.jsonl), then the phase times the loop measured. `clawgym inspect` gives the folder alone."""
    return {**rollout_values(sdir), **(engine or {}), **trees_values(sdir),
            **(train_values(sdir) if train is None else train), **(times or {})}


def cold_start_values(run: RunLayout) -> dict[str, float]:
    """The step-0 line after an [sft] cold start: teacher trajectories and their reward, the SFT
    loss of its first and last update, Pass@1 before (`EVAL_BASE`) and after (`EVAL`), and the
    seconds of each stage (`COLD_START_PHASES`)."""
    import orjson


    sdir = run.sft
    rollouts = A.read_table(sdir.rollouts, A.RolloutRecord)
    values: dict[str, float] = {TEACHER_N: len(rollouts), TEACHER_REWARD_MEAN: reward_mean(rollouts)}
    lines = A.read_jsonl(sdir.train_metrics).records if sdir.train_metrics.exists() else []
    losses = [r["train/loss"] for r in lines if "train/loss" in r]
    if losses:
        values[SFT_LOSS_FIRST], values[SFT_LOSS_LAST] = losses[0], losses[-1]
    for label, prefix in (("base", EVAL_BASE), ("sft", EVAL)):
        path = run.eval(label).eval_json
        if path.exists():
            values.update(eval_values(eval_figures(orjson.loads(path.read_bytes())), prefix))
    if run.cold_start_seconds.exists():
        values.update({k: float(v) for k, v in orjson.loads(run.cold_start_seconds.read_bytes()).items()})
    return values


def version_values(sdir: StepLayout, trainer_version: int, max_staleness: int) -> dict[str, float]:
    """An asynchronous step's policy versions: the oldest and newest among its calls, its groups, and
    those left out of training as too stale (by the trainer's own rule, `train.staleness`)."""
    rollouts = {r.rollout_id: r for r in A.read_table(sdir.rollouts, A.RolloutRecord)}
    versions = call_versions(sdir.calls) if sdir.calls.exists() else {}
    scored = {r.group_id for r in rollouts.values() if r.trainable}
    out = {GROUPS: float(len(scored)),
           STALE_GROUPS: float(len(stale_groups(rollouts, versions, trainer_version, max_staleness) & scored))}
    if versions:
        oldest = min(lo for lo, _ in versions.values())
        out |= {VERSION_MIN: float(oldest), VERSION_MAX: float(max(hi for _, hi in versions.values())),
                STALENESS_MAX: float(trainer_version - oldest)}
    return out
