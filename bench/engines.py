"""Engine bench: tokens/s and time to first token of the hf and vllm engines under concurrent rollouts.

    .venv-vllm/bin/python bench/engines.py                   # tiny model, hf vs vllm, 8 and 32 rollouts
    python3 bench/engines.py --engines hf                    # without vLLM installed
    .venv-vllm/bin/python bench/engines.py --out runs/bench-engines   # also write calls + mismatch

Each engine is loaded once (load time reported), warmed up, then for each concurrency c:
- time to first token: c rollouts ask for one token at once; the median latency of those calls
  (prefill + one decode step while the other c-1 are in flight — the engine interface is not
  streaming, so a one-token completion is its first token);
- throughput: c rollouts each sample --max-tokens tokens from their own --prompt-tokens prompt at
  temperature 1; sampled tokens / wall time.
Ratios are against the hf engine in the same run. With --out, every throughput call is
written as a calls.parquet per engine, and the train–inference mismatch of each is printed
(`clawgym mismatch` on the same files gives the same table).
"""

from __future__ import annotations

import argparse
import sys
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from clawgym.artifacts import CallRecord, write_table
from clawgym.engines import EngineConfig, Sampling, make_engine

import results_md  # bench/results_md.py: --write-results


@dataclass
class Row:
    engine: str
    rollouts: int
    tokens: int
    seconds: float
    ttft_ms: float
    load_s: float

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 1990) for _ in range(length)] for _ in range(n)]


async def bench_engine(name: str, model: Path, concurrency: list[int], max_tokens: int, prompt_tokens: int,
                       calls: list[CallRecord]) -> list[Row]:
    options = {"max_batch": max(concurrency)} if name == "hf" else {"max_model_len": 4096} if name == "vllm" else {}
    t0 = time.perf_counter()
    engine = make_engine(name, EngineConfig(model, options))
    load_s = time.perf_counter() - t0
    rows = []
    try:
        await engine.generate(prompts(1, prompt_tokens, 99)[0], Sampling(max_tokens=4), "warmup")
        for c in concurrency:
            async def timed(p: list[int], rid: str) -> float:
                t = time.perf_counter()
                await engine.generate(p, Sampling(max_tokens=1, temperature=1.0, seed=1), rid)
                return time.perf_counter() - t

            # fresh prompts for each measurement, so no prefix-cache hit flatters vLLM
            ttft = await asyncio.gather(*(timed(p, f"ttft-{c}-{i}") for i, p in enumerate(prompts(c, prompt_tokens, 1000 + c))))
            batch = prompts(c, prompt_tokens, c)
            sampling = Sampling(max_tokens=max_tokens, temperature=1.0)
            t = time.perf_counter()
            started = time.time()
            gens = await asyncio.gather(*(engine.generate(p, sampling, f"{name}-{c}-{i}") for i, p in enumerate(batch)))
            seconds = time.perf_counter() - t
            for i, (p, g) in enumerate(zip(batch, gens)):
                calls.append(CallRecord(
                    rollout_id=f"{name}-{c}-{i}", call_id=f"{name}-{c}-{i}-0", seq=0, protocol="direct", model=model.name,
                    started_at=started, finished_at=started + seconds, prompt_ids=p, output_ids=g.output_ids,
                    output_logprobs=g.output_logprobs, finish_reason=g.finish_reason, policy_version=g.policy_version,
                    sampling_json='{"temperature": 1.0, "max_tokens": %d}' % max_tokens))
            rows.append(Row(name, c, sum(len(g.output_ids) for g in gens), seconds, 1000 * statistics.median(ttft), load_s))
    finally:
        await engine.close()
    return rows


def render(rows: list[Row]) -> Table:
    base = {r.rollouts: r for r in rows if r.engine == "hf"}
    t = Table(title="engines: tiny model, CPU")
    for col in ("engine", "rollouts", "tokens", "tokens/s", "× hf", "TTFT p50 ms", "TTFT × hf", "load s"):
        t.add_column(col, justify="left" if col == "engine" else "right")
    for r in rows:
        b = base.get(r.rollouts)
        t.add_row(r.engine, str(r.rollouts), str(r.tokens), f"{r.tps:,.0f}",
                  f"{r.tps / b.tps:.2f}" if b and b.tps else "-", f"{r.ttft_ms:,.1f}",
                  f"{r.ttft_ms / b.ttft_ms:.2f}" if b and b.ttft_ms else "-", f"{r.load_s:.1f}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="model directory (default: a fresh `init-model --size tiny`)")
    ap.add_argument("--engines", default="hf,vllm", help="comma-separated engine names, hf first (the baseline)")
    ap.add_argument("--concurrency", default="8,32", help="concurrent rollouts, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, help="write OUT/ENGINE/calls.parquet and print their mismatch")
    ap.add_argument("--small", action="store_true", help="a correctness run in seconds: the hf engine, 2 rollouts of 4 "
                                                         "tokens, calls and their mismatch in a temporary folder")
    args = results_md.parse(ap)
    if args.small:
        args.engines, args.concurrency, args.max_tokens, args.prompt_tokens = "hf", "2", 4, 16
        args.out = Path(tempfile.mkdtemp(prefix="clawgym-bench-engines-"))
    console = Console()
    tmp = None
    model = args.model
    if model is None:  # the tiny model; kept beside the calls with --out so that they can be re-measured
        from clawgym.models.tiny import init_model

        if args.out:
            model = args.out / "model"
            if not (model / "config.json").exists():
                init_model(model, seed=0, size="tiny")
        else:
            tmp = tempfile.TemporaryDirectory(prefix="clawgym-bench-")
            model = init_model(Path(tmp.name) / "tiny", seed=0, size="tiny").path
    concurrency = [int(x) for x in args.concurrency.split(",")]
    rows: list[Row] = []
    written: list[Path] = []
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        calls: list[CallRecord] = []
        with console.status(f"benchmarking {name}"):
            rows += asyncio.run(bench_engine(name, Path(model), concurrency, args.max_tokens, args.prompt_tokens, calls))
        if args.out:
            path = args.out / name / "calls.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_table(path, calls, CallRecord)
            written.append(path)
    console.print(render(rows))
    if written:
        from clawgym.run.mismatch import run_mismatch

        run_mismatch(written, Path(model), console)
        console.print(f"calls written to {', '.join(map(str, written))}; model {model}")
    if tmp is not None:
        tmp.cleanup()
    if args.small:
        import shutil

        shutil.rmtree(args.out, ignore_errors=True)
        if not rows or any(r.tokens <= 0 for r in rows):
            sys.exit("an engine sampled no tokens")


if __name__ == "__main__":  # vLLM spawns its engine process: the guard keeps it from re-running the bench
    main()
