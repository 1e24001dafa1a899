"""Benchmark `clawgym train`'s peak memory against the size of the step: it should follow the
micro-batch token budget, not the step.

Each step is Codex-shaped, as `recipes/codex.toml` makes them on SmolLM2: GRPO groups of 4 rollouts
under one ~600-token system prompt, each a task prompt then calls of up to 48 sampled tokens and
tool outputs of 100-400 tokens, sized to about 5k, 15k, 30k and 60k packed tokens (more rollouts,
as a step with more tasks or longer rollouts has). Each size is trained by `clawgym train` as a
user runs it (one process, the default settings and `--token-budget`), and the bench reports the
process's peak resident memory (the kernel's ru_maxrss of that child), the expected peak the
trainer's memory check printed (train/memory_guard.py), the tokens forwarded per unique token of
the step (the shared prefix forwarded once per optimizer step), the micro-batch budget the update
was planned with, and the wall time.

The baseline, in the same run, is the same steps without activation checkpointing (the trainer's
default before it was turned on), on the sizes where its peak stays inside this machine; the ratio
of the two peaks and of the two times is printed per size.

    python3 bench/train_memory.py                          # SmolLM2-135M-Instruct, about 20 min on 2 cores
    python3 bench/train_memory.py --small                  # seconds: the tiny model, one 3k-token step
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from clawgym.artifacts import RolloutRecord, TreeNode, write_table
from clawgym.models.pretrained import model_by_name

import results_md  # bench/results_md.py: --write-results

GIB = 2.0**30
SYSTEM, TASK, GROUP = 600, 120, 4


def codex_step(out: Path, target: int, vocab: int, seed: int = 0) -> int:
    """Write a Codex-shaped step of about `target` packed tokens into `out`; returns its unique tokens."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(4, vocab) for _ in range(n)]

    per_rollout = 1250
    groups = max(1, round(target / per_rollout / GROUP))
    per_rollout = target / (groups * GROUP)
    system = toks(SYSTEM)
    nodes: list[TreeNode] = []
    rows: list[RolloutRecord] = []
    unique = SYSTEM
    for g in range(groups):
        task = toks(TASK)
        unique += TASK
        for r in range(GROUP):
            rid, ids, depth = f"t{g}.{r}", [], 0

            def add(parent: int, tokens: list[int], kind: str) -> int:
                nonlocal depth
                lps = [-rng.random() for _ in tokens] if kind == "model" else []
                nodes.append(TreeNode(rid, len(ids), parent, tokens, kind, lps, f"c{len(ids)}", 0, "main", True, depth))
                ids.append(len(ids))
                depth += len(tokens)
                return ids[-1]

            x = add(-1, system + task, "env")
            while True:
                out_toks = toks(rng.randint(12, 48))
                left = per_rollout - depth - len(out_toks)
                m = add(x, out_toks, "model")
                unique += len(out_toks)
                if left < 150:
                    break
                tool = toks(min(int(left), rng.randint(100, 400)))
                x = add(m, tool, "env")
                unique += len(tool)
            calls = sum(1 for n in nodes if n.rollout_id == rid and n.kind == "model")
            rows.append(RolloutRecord(rid, f"task{g}", "codex", f"task{g}+codex", r, "ok", float(r % 2), calls, 1.0, 0))
    out.mkdir(parents=True, exist_ok=True)
    write_table(out / "trees.parquet", nodes, TreeNode)
    write_table(out / "rollouts.parquet", rows, RolloutRecord)
    return unique


def train_once(step: Path, model: Path, out: Path, extra: list[str]) -> dict:
    """One `clawgym train` process on `step`; its peak RSS, wall time and what it printed and logged."""
    metrics = out.with_suffix(".jsonl")
    cmd = [sys.executable, "-m", "clawgym.cli", "train", str(step), "--model", str(model), "--out", str(out),
           "--metrics", str(metrics), *extra]
    log = out.with_suffix(".log")
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak RSS alone
    wall = time.perf_counter() - t0
    stderr = log.read_text()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"clawgym train failed ({os.waitstatus_to_exitcode(status)}):\n{stderr[-2000:]}")
    peak = usage.ru_maxrss * 1024 / GIB  # KiB on Linux
    lines = [orjson.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    packed = re.search(r"([\d,]+) packed tokens", stderr)
    expected = re.search(r"memory: expected peak ([\d.]+) GiB", stderr)
    return {"peak": peak, "wall": wall, "packed": int(packed[1].replace(",", "")) if packed else 0,
            "expected": float(expected[1]) if expected else float("nan"),
            "forwarded": sum(r["train/tokens_forwarded"] for r in lines),
            "budget": int(lines[-1]["train/token_budget"]), "updates": len(lines)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct",
                    help="model directory, a `clawgym init-model --from` name, or `tiny` (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--sizes", default="5000,15000,30000,60000", help="packed tokens of the steps, comma-separated")
    ap.add_argument("--baseline-sizes", default="5000,15000",
                    help="the sizes also trained without activation checkpointing (its peak grows ~5x faster)")
    ap.add_argument("--epochs", type=int, default=1, help="passes over each step (default: the trainer's)")
    ap.add_argument("--small", action="store_true", help="a smoke run in seconds: the tiny model, one 3k-token step, its baseline")
    a = results_md.parse(ap)
    if a.small:
        a.model, a.sizes, a.baseline_sizes = "tiny", "3000", "3000"
    sizes = [int(x) for x in a.sizes.split(",")]
    base_sizes = {int(x) for x in a.baseline_sizes.split(",") if x}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        model = model_by_name(None if a.model == "tiny" else a.model, scratch)
        vocab = orjson.loads((model / "config.json").read_bytes())["vocab_size"]
        print(f"model {model.name}, default settings of `clawgym train` (token budget, activation checkpointing, "
              f"shared prefixes), {a.epochs} epoch(s), one process, {os.cpu_count()} CPUs", flush=True)
        header = ("| packed tokens | unique | updates | budget | peak RSS GiB | expected GiB | forwarded / unique | wall s "
                  "| no checkpointing: peak GiB | its expected GiB | peak ratio | wall ratio |")
        rows = [header, "|" + "---|" * (header.count("|") - 1)]
        for size in sizes:
            step = scratch / f"step-{size}"
            unique = codex_step(step, size, vocab)
            extra = ["--epochs", str(a.epochs)]
            r = train_once(step, model, scratch / f"out-{size}", extra)
            cells = [f"{r['packed']:,}", f"{unique:,}", str(r["updates"]), f"{r['budget']:,}", f"{r['peak']:.2f}",
                     f"{r['expected']:.2f}", f"{r['forwarded'] / (unique * r['updates']):.2f}", f"{r['wall']:.0f}"]
            if size in base_sizes:
                b = train_once(step, model, scratch / f"base-{size}", [*extra, "--no-activation-checkpointing"])
                cells += [f"{b['peak']:.2f}", f"{b['expected']:.2f}", f"{r['peak'] / b['peak']:.2f}", f"{r['wall'] / b['wall']:.2f}"]
            else:
                cells += ["-", "-", "-", "-"]
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
        print()
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
