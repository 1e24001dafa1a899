"""The run over the stages: `clawgym run`'s loop and cold start, the recipe and its checks, and what
reads whole runs (eval, compare, replay, inspect, mismatch, metrics, sinks, plots); docs/architecture.md,
"The source tree"."""
