"""The CPU seconds one rank of `train` spends in each phase, for measuring what data parallelism repeats.

With CLAWGYM_CPU_PHASES=DIR in the environment, each rank writes DIR/rank-R.json at the end of
`train`: {phase: CPU seconds} of its own process (user + system, all threads, `time.process_time`).
`startup` is everything before the batch is read (interpreter, imports, the process group), the
rest are the loop's phases in order. bench/data_parallel.py reads them; without the variable the
phases are counted (two clock reads each) and nothing is written.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV = "CLAWGYM_CPU_PHASES"


class CpuPhases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.current, self.since = "startup", 0.0  # process_time counts from the process's start

    def enter(self, phase: str) -> None:
        """End the current phase and start `phase` (a phase entered again adds to its total)."""
        now = time.process_time()
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self.since
        self.current, self.since = phase, now

    def write(self, rank: int) -> None:
        """Close the current phase; write this rank's totals where CLAWGYM_CPU_PHASES says, if it does."""
        self.enter("done")
        target = os.environ.get(ENV)
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            (Path(target) / f"rank-{rank}.json").write_text(json.dumps(self.seconds))
