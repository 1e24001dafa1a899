"""Rollouts: sandboxes, harness adapters, the verifier and the rollout runner (DESIGN §5)."""
