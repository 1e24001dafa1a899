"""Benchmark what a second data-parallel rank costs: `clawgym train` under torchrun on 1 and 2 ranks.

The step is made as a user makes one: `clawgym init-model --size small`, a scripted agentloop
rollout of the toy tasks with `--group-size 8` and answers of uneven length (digits and letters mixed, so
the GRPO groups have signal), `build-trees`; two shapes: short answers (1-8 words), where the
harness's shared prompt is most of the step, and long ones (1-200 words). The same `clawgym train
STEP --algo grpo --epochs E` then runs under `torchrun --standalone --nproc_per_node N` with OMP_NUM_THREADS=1, N = 1 and 2,
for DDP and for FSDP (`--fsdp`, 2 ranks only; compared with the same one process). Each rank writes the CPU seconds of its phases (the trainer's
CLAWGYM_CPU_PHASES hook, train/cpu_phases.py): start-up (interpreter, imports, process group),
batch (reading, choosing and packing the trees), models (loading and wrapping), plan (the rank's
micro-batches and the memory check), score (logp_old), updates (forward, backward, collectives,
optimizer steps), checkpoint. The bench prints them per rank and the ratio of the total CPU
seconds (user + system of torchrun and every rank, from the kernel) of 2 ranks to 1 rank, and
checks the two runs' weights agree.

    python3 bench/data_parallel.py                   # 24 epochs, DDP and FSDP, two shapes: about 15 min on 2 cores
    python3 bench/data_parallel.py --small           # seconds: 1 epoch, --group-size 2, DDP only
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import results_md  # bench/results_md.py: --write-results

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "recipes" / "tasks" / "toy"
PHASES = ("startup", "batch", "models", "plan", "score", "updates", "checkpoint")


def clawgym(*args: str, cwd: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "clawgym.cli", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"clawgym {args[0]} failed ({r.returncode}):\n{r.stderr[-2000:]}")


def make_step(scratch: Path, n: int, seed: int = 0, max_words: int = 60) -> tuple[Path, Path]:
    """The small model and a built step of the toy tasks × n scripted answers of uneven length."""
    rng = random.Random(seed)
    model, step = scratch / "model", scratch / "step-0001"
    clawgym("init-model", str(model), "--size", "small", cwd=scratch)
    answers = []
    for _ in range(len(list(TOY.iterdir())) * n + 8):
        words = rng.randint(1, max_words)  # a few tokens to a few hundred
        answers.append(" ".join(str(rng.randint(0, 999)) if rng.random() < rng.random() else "abc" for _ in range(words)))
    script = scratch / "answers.jsonl"
    script.write_text("".join(json.dumps({"rollout_id": "*", "text": a}) + "\n" for a in answers))
    clawgym("rollout", "--tasks", str(TOY), "--harness", "agentloop", "--group-size", str(n), "--model", str(model),
            "--engine", "scripted", "--script", str(script), "--out", str(step), cwd=scratch)
    clawgym("build-trees", str(step), cwd=scratch)
    return model, step


def train_ranks(step: Path, model: Path, out: Path, ranks: int, epochs: int, extra: list[str]) -> dict:
    """`clawgym train` under torchrun with `ranks` processes: the CPU seconds of the whole launch (the
    kernel's rusage of torchrun and its children), wall seconds, and each rank's phase seconds."""
    phases = out.with_name(out.name + "-cpu")
    phases.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CLAWGYM_CPU_PHASES": str(phases)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m", "clawgym.cli",
           "train", str(step), "--model", str(model), "--algo", "grpo", "--epochs", str(epochs), "--out", str(out), *extra]
    log = out.with_name(out.name + ".log")
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"torchrun ({ranks} ranks) failed:\n{log.read_text()[-3000:]}")
    per_rank = [json.loads((phases / f"rank-{r}.json").read_text()) for r in range(ranks)]
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall, "ranks": per_rank}


def max_weight_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return max(float((x[k].float() - y[k].float()).abs().max()) for k in x)


def measure(scratch: Path, words: int, n: int, epochs: int, no_fsdp: bool) -> list[str]:
    """The table rows of one step shape: DDP (and FSDP) on 1 and 2 ranks, each rank's phases."""
    model, step = make_step(scratch, n, max_words=words)
    one = train_ranks(step, model, scratch / "one", 1, epochs, [])  # FSDP needs 2 ranks: both compare with this
    rows = [row(words, "1 process", 0, one, None, None)]
    for mode, extra in (("DDP", []), *(() if no_fsdp else (("FSDP", ["--fsdp"]),))):
        two = train_ranks(step, model, scratch / mode, 2, epochs, extra)
        dw = max_weight_diff(scratch / "one", scratch / mode)
        rows += [row(words, mode, rank, two, one, dw) for rank in range(2)]
    return rows


def row(words: int, mode: str, rank: int, run: dict, one: dict | None, dw: float | None) -> str:
    """One rank's table row; the run's totals, and its ratios to one process, on rank 0's."""
    ph, first = run["ranks"][rank], rank == 0
    updates = sum(r.get("updates", 0.0) for r in run["ranks"])
    ratios = [f"{run['cpu'] / one['cpu']:.2f}", f"{updates / one['ranks'][0]['updates']:.2f}", f"{dw:.1e}"] \
        if one is not None and first else ["", "", ""]
    cells = [f"1-{words} words", mode, f"{len(run['ranks'])} (rank {rank})", f"{run['cpu']:.1f}" if first else "",
             f"{run['wall']:.1f}" if first else "", *(f"{ph.get(p, 0.0):.2f}" for p in PHASES), *ratios]
    print("| " + " | ".join(cells) + " |", flush=True)
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per toy task")
    ap.add_argument("--no-fsdp", action="store_true", help="DDP only")
    ap.add_argument("--words", default="8,200", help="the most words of an answer, one step shape each, comma-separated")
    ap.add_argument("--small", action="store_true", help="a smoke run in seconds: 1 epoch, --group-size 2, DDP only")
    a = results_md.parse(ap)
    if a.small:
        a.epochs, a.group_size, a.no_fsdp, a.words = 1, 2, True, "8"
    print(f"`clawgym train --algo grpo --epochs {a.epochs}` on {a.group_size} agentloop rollouts of each of the "
          f"{len(list(TOY.iterdir()))} toy tasks (the small model), under torchrun, OMP_NUM_THREADS=1, {os.cpu_count()} CPUs",
          flush=True)
    header = ("| answers | mode | ranks | CPU s | wall s | " + " | ".join(f"rank CPU s: {p}" for p in PHASES)
              + " | CPU: 2 ranks / 1 | updates CPU: 2 ranks / 1 | max abs Δw to 1 process |")
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    for words in (int(w) for w in a.words.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            rows += measure(Path(tmp), words, a.group_size, a.epochs, a.no_fsdp)
    print()
    print("\n".join(rows))
    print("\nCPU s: user + system seconds of torchrun and all its ranks (the kernel's rusage); a rank's phases "
          "are its own process's CPU seconds in each phase of `train` (train/cpu_phases.py); updates CPU: the "
          "ranks' updates phases summed, over one process's. FSDP on 2 ranks is compared with 1 process (FSDP "
          "needs 2).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
