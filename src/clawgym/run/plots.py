"""Plots of a run (matplotlib PNGs in RUN/plots): reward, eval score, entropy, mismatch — like the paper's Figures 2–4 —
loss, and an asynchronous run's staleness.

Each figure is drawn from metrics.jsonl alone, only for the series the run has, and rewritten after
every step, so the plots of a running or resumed run are always current.
"""

from __future__ import annotations

from pathlib import Path

from clawgym import artifacts as A
from clawgym.layout import RunLayout

# figure name -> (title, y label, metric key prefixes or exact keys)
FIGURES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "reward": ("Train reward", "mean reward", ("rollout/reward_mean",)),
    "eval": ("Evaluation", "Pass@1 (%)", ("eval/pass@1", "eval/base/pass@1")),  # step 0: after SFT (and before it, base)
    "entropy": ("Policy entropy", "nats / token", ("train/entropy",)),
    "mismatch": ("Rollout–trainer mismatch", "value", ("train/mismatch", "train/tis_clip_frac")),
    "loss": ("Loss", "loss", ("train/loss", "train/value_loss")),
    # an asynchronous run: how far its rollouts lag the weights they train, and the groups the bound left out
    "staleness": ("Staleness", "versions behind / groups", ("rollout/staleness_max", "rollout/stale_groups")),
}


def _series(lines: list[A.MetricsLine], prefixes: tuple[str, ...]) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for m in lines:
        for key, v in m.values.items():
            if key.startswith(prefixes) and isinstance(v, (int, float)):
                xs, ys = out.setdefault(key, ([], []))
                xs.append(m.step)
                ys.append(float(v))
    return out


def write_plots(run_dir: str | Path) -> list[Path]:
    """Write RUN/plots/<figure>.png for every figure with data; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = RunLayout(run_dir)
    metrics = run.metrics
    if not metrics.exists():
        return []
    lines = A.read_metrics(metrics)
    written = []
    for name, (title, ylabel, prefixes) in FIGURES.items():
        series = _series(lines, prefixes)
        per_harness = [k for k in series if k.startswith("rollout/reward_mean/")]
        if len(per_harness) == 1:  # one harness: its curve is the mean's
            series.pop(per_harness[0])
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=110)
        scale = 100.0 if name == "eval" else 1.0  # Pass@1 in % as every table shows it
        for key, (xs, ys) in sorted(series.items()):
            ax.plot(xs, [scale * y for y in ys], marker="o", markersize=3, label=key)
        ax.set_title(f"{title} — {run.root.name}")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1 or name in ("reward", "eval"):
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = run.plots / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.png")
        fig.savefig(tmp)
        plt.close(fig)
        tmp.replace(path)
        written.append(path)
    return written
