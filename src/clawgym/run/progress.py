"""What `clawgym run` prints: one readable line per step (and the cold start's step 0), and the
progress bar over the run's steps with the current phase and an ETA beside it."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from clawgym.run import metrics as M

# (metrics key, format) of the step line's optional figures; the KL to a reference policy, when
# trained with one, replaces the rollout-trainer mismatch. The train/ and trees/ names are those of
# train.step_metrics and trees.stats (metrics.FAMILIES); a test checks that each is a known key.
FIELDS = ((M.PASS_AT_1, "pass@1 {:.1%}"), ("train/kl_ref", "kl {:.4f}"), ("train/mismatch_abs", "mismatch {:.4f}"),
          ("train/clip_frac", "clip {:.3f}"), ("train/grad_norm", "grad {:.2f}"), ("train/tokens_per_s", "{:,.0f} tok/s"))
TREE_RATIO, TOKENS_SAVED = "trees/tree_token_ratio", "trees/tokens_saved"


def duration(seconds: float) -> str:
    """A short human duration: 42s, 3m05s, 2h14m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def step_line(step: int, steps: int, values: dict[str, float], eta_s: float | None) -> str:
    """One readable line of a step's metrics.jsonl values, e.g.

        step 3/8  reward 0.412 ± 0.180  pass@1 52.0%  mismatch 0.0012  clip 0.000  grad 1.98  2,466 tok/s
        tree 0.36 (49,040 tok saved)  prefix cache 91% hit, 9% computed | rollout 1m26s  trees 2s  train 5s  sync 1s  eval 20s
        | peak GiB rollout 2.1  trees 0.9  train 4.2  sync 1.6  eval 2.0 | ETA 8m12s

    Metrics absent from `values` are left out.
    """
    v = values
    parts = [f"step {step}/{steps}", f"reward {v.get(M.REWARD_MEAN, 0.0):.3f} ± {v.get(M.REWARD_STD, 0.0):.3f}"]
    shown = [key for key, _ in FIELDS if key in v and not (key == "train/mismatch_abs" and "train/kl_ref" in v)]
    parts += [fmt.format(v[key]) for key, fmt in FIELDS if key in shown]
    if M.VERSION_MIN in v:  # an asynchronous step: the policy versions that sampled its rollouts
        parts.append(f"v {v[M.VERSION_MIN]:.0f}-{v[M.VERSION_MAX]:.0f}")
    if v.get(M.STALE_GROUPS):  # left out whole; most of a step's groups left out starves the run, which it says
        stale, groups = v[M.STALE_GROUPS], v.get(M.GROUPS, 0.0)
        parts.append(f"stale {stale:.0f}/{groups:.0f} groups dropped"
                     + (" (most: raise [run] max_staleness or lower [rollout] concurrency)" if stale > groups / 2 else ""))
    if TREE_RATIO in v:  # what tree packing saved over forwarding every call on its own
        parts.append(f"tree {v[TREE_RATIO]:.2f} ({v.get(TOKENS_SAVED, 0.0):,.0f} tok saved)")
    if M.PREFIX_HIT_RATE in v:  # what the engine's prefix cache spared the step's prompts (docs/engines.md)
        parts.append(f"prefix cache {v[M.PREFIX_HIT_RATE]:.0%} hit, {v.get(M.PROMPT_COMPUTED_SHARE, 1.0):.0%} computed")
    phases = [f"{p.label} {duration(v[p.key])}" for p in M.PHASES if p.key in v]
    peaks = [f"{p.label} {v[p.peak_key]:.1f}" for p in M.PHASES if p.peak_key in v]
    line = "  ".join(parts)
    if phases:
        line += " | " + "  ".join(phases)
    if peaks:  # the process's resident high-water mark in each phase: the trainer's, the engine's
        line += " | peak GiB " + "  ".join(peaks)
    if eta_s is not None:
        line += f" | ETA {duration(eta_s)}"
    return line


def cold_start_line(values: dict[str, float]) -> str:
    """The step-0 line after an [sft] cold start: teacher reward, SFT loss, Pass@1 before and after."""
    v = values
    parts = [f"step 0 (SFT cold start)  teacher reward {v.get(M.TEACHER_REWARD_MEAN, 0.0):.3f}"]
    if M.SFT_LOSS_FIRST in v:
        parts.append(f"sft loss {v[M.SFT_LOSS_FIRST]:.3f} → {v[M.SFT_LOSS_LAST]:.3f}")
    base = f"{M.EVAL_BASE}pass@1"
    if base in v and M.PASS_AT_1 in v:
        parts.append(f"pass@1 {v[base]:.1%} → {v[M.PASS_AT_1]:.1%}")
    line = "  ".join(parts)
    phases = [f"{p.label} {duration(v[p.key])}" for p in M.COLD_START_PHASES if p.key in v]
    return line + (" | " + "  ".join(phases) if phases else "")


class StepProgress:
    """One progress bar over a run's steps; step lines print above it, the current phase beside it."""

    def __init__(self, console: Console, steps: int, done: int):
        self.console, self.steps = console, steps
        self.progress = Progress(TextColumn("[bold]steps"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=console, transient=True)
        self.bar = self.progress.add_task("", total=steps, completed=done)
        self.timed: list[float] = []  # seconds of the steps run in this process (resumed ones excluded)

    def __enter__(self) -> StepProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def phase(self, step: int, name: str) -> None:
        eta = self.eta(step - 1)
        self.progress.update(self.bar, description=f"step {step}: {name}" + (f"  ETA {duration(eta)}" if eta is not None else ""))

    def eta(self, done: int) -> float | None:
        """Seconds left after `done` steps, from the mean time of the steps this process ran."""
        if not self.timed:
            return None
        return (self.steps - done) * sum(self.timed) / len(self.timed)

    def finished(self, step: int, values: dict[str, float], seconds: float | None) -> None:
        """Print the step's line and advance; `seconds` None: the step was trained before a resume."""
        if seconds is not None:
            self.timed.append(seconds)
        self.progress.update(self.bar, completed=step, description="")
        self.console.print(step_line(step, self.steps, values, self.eta(step) if step < self.steps else None),
                           highlight=False, soft_wrap=True)
