"""clawgym: reinforcement learning for LLM agents through unmodified agent harnesses (ClawGym II)."""

__version__ = "0.1.0"
