"""How many CPU threads each forward of the hf engine gets, chosen by timing forwards as they run.

On a CPU shared with other processes, torch's intra-op threads wait at every operator's barrier for
the slowest of them, and a thread the scheduler has parked stalls them all; on an idle machine more
threads win, for prefill (compute-bound) most of all. Which is faster flips with the neighbours'
load (docs/engines.md, "Decode speed").
Neither count is right everywhere, and the load changes while a run goes on, so the engine times
both: for each kind of forward it keeps a moving average of seconds per unit of work for 1 thread
and for the most threads allowed, uses the faster, and now and then tries the slower one so that a
change of load is noticed: after `explore_every` x (slower / faster) forwards, so that trying costs
at most about 1/`explore_every` of the time whatever the gap. A kind starts with the most threads
(what an idle machine wants), and the other count is tried only on a forward of at most
`explore_work` units: prefill forwards range from a few tokens to a whole harness prompt, and
trying one thread on a 2,000-token chunk would cost as much as a hundred small tries. `torch.set_num_threads` from the engine's
worker thread sets that thread's OpenMP and MKL counts, and also the count a thread that has not run
torch yet starts with; so `record` puts the count back to `most` after each forward, and a trainer
thread that starts while the engine is idle (as `clawgym run` does) gets all threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ThreadTuner:
    """Per kind of forward (e.g. "decode1", "prefill"): the faster of 1 and `most` threads, by timing."""

    most: int
    explore_every: int = 16
    explore_work: int = 512
    """the largest forward (units of `record`'s work) on which the slower or untried count is tried"""
    adaptive: bool = True
    ema: dict[tuple[str, int], float] = field(default_factory=dict)
    since: dict[str, int] = field(default_factory=dict)
    """forwards of each kind since the slower count was last tried"""

    def choices(self) -> list[int]:
        return sorted({1, self.most}) if self.adaptive else [self.most]

    def pick(self, kind: str, work: int = 1) -> int:
        """The thread count for a forward of `kind` doing `work` units, already set in torch for this thread."""
        import torch

        options = self.choices()
        n = self.since[kind] = self.since.get(kind, 0) + 1
        unknown = [c for c in options if (kind, c) not in self.ema]
        small = work <= self.explore_work
        if len(options) == 1 or len(unknown) == len(options):
            choice = self.most if self.most in options else options[-1]
        elif unknown:
            known = next(c for c in options if c not in unknown)
            choice = unknown[0] if small else known
            if small:
                self.since[kind] = 0
        else:
            fast, slow = sorted(options, key=lambda c: self.ema[(kind, c)])
            gap = self.ema[(kind, slow)] / max(self.ema[(kind, fast)], 1e-9)
            choice = fast
            if small and n >= self.explore_every * min(gap, 64.0):
                choice, self.since[kind] = slow, 0
        if torch.get_num_threads() != choice:
            torch.set_num_threads(choice)
        return choice

    def record(self, kind: str, threads: int, seconds: float, work: int = 1) -> None:
        """A forward of `kind` with `threads` threads took `seconds` for `work` units (tokens, steps)."""
        import torch

        if threads != self.most:
            torch.set_num_threads(self.most)
        per = seconds / max(1, work)
        old = self.ema.get((kind, threads))
        self.ema[(kind, threads)] = per if old is None else 0.7 * old + 0.3 * per

    def best(self, kind: str) -> int | None:
        known = [c for c in self.choices() if (kind, c) in self.ema]
        return min(known, key=lambda c: self.ema[(kind, c)]) if known else None


def decode_kind(rows: int) -> str:
    """Decode steps are timed per batch-size bucket (1, 2-3, 4-7, 8-15, ...): their cost is not linear in rows."""
    return f"decode{1 << (max(1, rows).bit_length() - 1)}"
