"""The names of the keys of a run's metrics.jsonl, and what TRL and verl call the same figures.

A step's metrics line is written by several stages; this module is the one list of its names.
The `rollout/` and `eval/` keys the loop computes are declared here and used by name; the `train/`
keys are those of `train.step_metrics.REDUCTIONS` (each with its rule for summing a step's
updates) and the `trees/` keys those of `trees.stats`; `FAMILIES` says which prefix each module
owns, and `tests/test_cli_edges.py` checks that every key a step writes is one of them.

Units: rewards, Pass@1 and every fraction are in [0, 1] (tables that show percent say "%" in their
header); a std is the sample standard deviation (n − 1), as `torch.std` gives TRL's `reward_std`;
lengths are in tokens; times in seconds. docs/recipes.md ("Metric names") has the table of `PEERS`.
"""

from __future__ import annotations

REWARD_MEAN = "rollout/reward_mean"
"""mean reward over the step's scored rollouts"""
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
TIMEOUTS = "rollout/timeout"
PREFIX_HIT_RATE = "proxy/prefix_hit_rate"
"""share of the step's prompt tokens whose keys and values the engine's prefix cache served (docs/engines.md)"""
PROMPT_COMPUTED_SHARE = "proxy/prompt_computed_share"
"""share of the step's prompt tokens the engine ran a forward over (1.0 without a cache)"""
PASS_AT_1 = "eval/pass@1"
"""held-out Pass@1, a fraction: the mean over tasks of each task's mean score over its samples"""

ROLLOUT_KEYS = (ROLLOUTS, REWARD_MEAN, REWARD_STD, INFRA_ERRORS, TIMEOUTS, RESPONSE_LENGTH_MEAN, RESPONSE_LENGTH_MAX,
                TURNS_MEAN, TURNS_MAX)
PROXY_KEYS = (PREFIX_HIT_RATE, PROMPT_COMPUTED_SHARE)

FAMILIES = {
    "rollout/reward_mean/": "loop.rollout_values: the mean reward of one harness (rollout/reward_mean/HARNESS)",
    "trees/": "trees.stats.TreeStats.to_metrics",
    "train/": "train.step_metrics.REDUCTIONS",
    "eval/": "eval.EvalReport.metrics (eval/pass@1, eval/pass@1/CATEGORY, eval/excluded; eval/base/ before an [sft] cold start)",
    "time/": "loop: seconds per phase (collect, reconstruct, optimize, sync, eval) and per step",
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
    "time/step_s": ("-", "timing_s/step"),
}
"""clawgym key -> (TRL's GRPOTrainer log name, verl's), "-" where the peer logs none"""


def is_known(key: str) -> bool:
    """Whether `key` is declared here or lies in a family another module owns."""
    return key in ROLLOUT_KEYS or key in PROXY_KEYS or key == PASS_AT_1 or any(key.startswith(prefix) for prefix in FAMILIES)
