"""The `train` stage: GRPO, PPO and SFT over packed prefix trees (see loop.py)."""
