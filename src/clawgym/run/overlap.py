"""The asynchronous loop's collector: later steps' rollouts in a thread of their own, under a staleness bound.

With `[run] max_staleness = K >= 1`, step j's rollouts may be sampled by policies up to K versions
behind the weights step j trains (j - 1: the checkpoint of step j - 1). So the collector starts
step j as soon as the proxy serves version j - 1 - K or later, which for K = 1 is while step j - 1
trains; the trainer, for its part, waits for step j's rollouts, trains, has the proxy serve the new
checkpoint and tells the collector (`served`). The engine takes each checkpoint in place
(`/admin/reload`): a call in flight finishes on the weights it started with, and every call records
the version that sampled it, so the trainer can hold each token to the bound (train/staleness.py)
and weight it by its recorded behaviour logprob (docs/training.md, "Asynchronous steps").

Collection keeps its stage's guarantees: a step's rollouts are written once, complete, and a
resumed run collects only what is missing, at the version the proxy then serves.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from rich.console import Console

from clawgym.layout import RunLayout
from clawgym.run import metrics as M
from clawgym.run.recipe import Recipe
from clawgym.run.steps import collect, engine_counts


class Overlap:
    """Steps `first`..`last` collected in order in one thread, each once the served version allows."""

    def __init__(self, recipe: Recipe, run: RunLayout, first: int, proxy, stages: Console):
        self.recipe, self.run, self.proxy, self.stages = recipe, run, proxy, stages
        self.first, self.last, self.bound = first, recipe.run.steps, recipe.run.max_staleness
        self.version = first - 1
        """the policy version the proxy serves: the last step whose checkpoint it took"""
        self.collected: dict[int, tuple[float, dict[str, float]]] = {}
        self.error: BaseException | None = None
        self.stopping = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._collect_all, name="clawgym-collect", daemon=True)

    def start_of(self, step: int) -> int:
        """The served version step `step`'s collection waits for: j - 1 - K."""
        return step - 1 - self.bound

    def _collect_all(self) -> None:
        try:
            for step in range(self.first, self.last + 1):
                with self.cond:
                    self.cond.wait_for(lambda: self.stopping or self.version >= self.start_of(step))
                    if self.stopping:
                        return
                    served = self.version
                t, counts = time.monotonic(), engine_counts(self.proxy)
                collect(self.recipe, self.run.step(step), step, self.proxy, self.stages, served=served)
                engine = M.engine_values(counts, engine_counts(self.proxy))
                with self.cond:
                    self.collected[step] = (time.monotonic() - t, engine)
                    self.cond.notify_all()
        except BaseException as e:  # handed to the trainer's thread, which raises it as its own
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def wait(self, step: int) -> tuple[float, dict[str, float]]:
        """Block until step `step`'s rollouts are written: (the collection's seconds, the engine's
        prefix-cache figures over it); a failed collection raises its error here."""
        with self.cond:
            self.cond.wait_for(lambda: step in self.collected or self.error is not None)
            if step not in self.collected:
                raise self.error
            return self.collected[step]

    def served(self, step: int) -> None:
        """The proxy now serves step `step`'s checkpoint (policy version `step`)."""
        with self.cond:
            self.version = step
            self.cond.notify_all()

    def stop(self) -> None:
        """No further step starts; one under way ends with the proxy that serves it."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


@contextlib.contextmanager
def overlapped(recipe: Recipe, run: RunLayout, first: int, proxy, stages: Console) -> Iterator[Overlap | None]:
    """An Overlap collecting from step `first` on, for an asynchronous run; None for a synchronous one."""
    if not recipe.run.max_staleness or proxy is None or first > recipe.run.steps:
        yield None
        return
    overlap = Overlap(recipe, run, first, proxy, stages)
    overlap.thread.start()
    try:
        yield overlap
    finally:
        overlap.stop()
