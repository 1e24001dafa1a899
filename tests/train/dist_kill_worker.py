"""A launched train rank that dies (os._exit) in its Nth optimizer step when it is rank KILL_RANK.

Used by tests/train/test_train_distributed.py: argv = SPEC.json KILL_RANK N.
"""

import os
import sys

import torch

from clawgym.train import loop

kill_rank, kill_at = int(sys.argv[2]), int(sys.argv[3])
real_step, calls = torch.optim.AdamW.step, []


def dying_step(self, *a, **k):
    calls.append(1)
    if int(os.environ.get("RANK", "0")) == kill_rank and len(calls) == kill_at:
        os._exit(9)  # killed mid-step: no cleanup, no exception
    return real_step(self, *a, **k)


torch.optim.AdamW.step = dying_step
sys.exit(loop.main(sys.argv[1:2]))
