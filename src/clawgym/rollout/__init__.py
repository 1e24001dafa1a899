"""Rollouts: sandboxes, harness adapters, the verifier and the rollout runner (docs/harnesses.md, docs/tasks.md)."""
