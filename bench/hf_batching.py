"""hf engine bench: late admission (continuous batching at the decode step) vs waiting for the batch.

    python3 bench/hf_batching.py                                  # the tiny model
    python3 bench/hf_batching.py --model smollm2-135m-instruct    # SmolLM2 (converted once, cached)

Rollouts do not arrive together: a harness sends its next call when its tool returns. This bench
sends --requests requests one every --gap seconds (default: a quarter of one request's time
alone, so each arrives while earlier ones still decode). Each samples --max-tokens tokens at
temperature 1 with its own seed from a random --prompt-tokens prompt. For the same schedule it
runs the hf engine twice:

- `wait` (baseline, `late_admission=False`): a request that arrives mid-batch waits for the whole
  running batch to finish;
- `join` (the default): it joins the running batch at the next decode step.

The modes alternate --repeats times and each shows its fastest run. It prints sampled tokens / wall
time (first arrival to last answer), the process's CPU seconds (less disturbed than wall time on a
shared machine) and the mean latency per request, with the join/wait ratios, and checks that every
run sampled the same ids (seeded sampling is per request, so batching must not change it).
"""

from __future__ import annotations

import argparse
import sys
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from clawgym.models.pretrained import model_by_name

from clawgym.engines import Sampling
from clawgym.engines.hf import HFEngine

import results_md  # bench/results_md.py: --write-results


async def schedule(engine: HFEngine, prompts: list[list[int]], max_tokens: int, gap: float):
    """Send prompt i at i * gap seconds; (wall seconds, CPU seconds, tokens, latencies, ids per request)."""
    t0, c0 = time.perf_counter(), time.process_time()
    latencies: list[float] = [0.0] * len(prompts)

    async def one(i: int, p: list[int]):
        await asyncio.sleep(i * gap)
        start = time.perf_counter()
        g = await engine.generate(p, Sampling(max_tokens=max_tokens, temperature=1.0, seed=i))
        latencies[i] = time.perf_counter() - start
        return g.output_ids

    ids = await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)])
    return time.perf_counter() - t0, time.process_time() - c0, sum(map(len, ids)), latencies, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory or a `clawgym init-model --from` name (default: tiny)")
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gap", type=float, help="seconds between arrivals (default: a quarter of one request alone)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating; the fastest of each is shown")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--small", action="store_true", help="a correctness run in seconds: 3 requests of 4 tokens, one repeat; "
                                                         "exits 1 unless every run sampled the same ids")
    a = results_md.parse(ap)
    if a.small:
        a.requests, a.max_tokens, a.prompt_tokens, a.repeats = 3, 4, 16, 1
    with tempfile.TemporaryDirectory() as tmp:
        path = model_by_name(a.model, Path(tmp))
        rng = random.Random(0)
        engines = {mode: HFEngine(path, max_batch=a.requests, threads=a.threads, late_admission=mode == "join")
                   for mode in ("wait", "join")}
        vocab = engines["wait"].model.config.vocab_size
        prompts = [[rng.randrange(10, vocab - 10) for _ in range(a.prompt_tokens)] for _ in range(a.requests)]
        for e in engines.values():  # warm-up: first forwards are slow
            asyncio.run(schedule(e, prompts[:1], 4, 0.0))
        warm = asyncio.run(schedule(engines["wait"], prompts[:1], a.max_tokens, 0.0))  # one request alone
        gap = a.gap if a.gap is not None else warm[0] / 4
        print(f"model {path.name}: {a.requests} requests, one every {gap:.2f} s, {a.prompt_tokens}-token prompts, "
              f"{a.max_tokens} tokens each; one request alone {warm[0]:.2f} s")
        runs: dict[str, list] = {mode: [] for mode in engines}
        for _ in range(a.repeats):  # modes alternate, so load from other jobs hits both alike
            for mode, e in engines.items():
                runs[mode].append(asyncio.run(schedule(e, prompts, a.max_tokens, gap)))
        res = {mode: min(rs, key=lambda r: r[0]) for mode, rs in runs.items()}  # each mode's least disturbed run
        for e in engines.values():
            asyncio.run(e.close())
    print(f"{'mode':6} {'tokens':>7} {'wall s':>8} {'CPU s':>8} {'tokens/s':>9} {'mean latency s':>15}")
    for mode, (wall, cpu, tokens, lat, _) in res.items():
        print(f"{mode:6} {tokens:7d} {wall:8.2f} {cpu:8.2f} {tokens / wall:9.1f} {statistics.mean(lat):15.2f}")
    (ww, wc, wt, wl, _), (jw, jc, jt, jl, _) = res["wait"], res["join"]
    same = all(r[4] == runs["wait"][0][4] for rs in runs.values() for r in rs)
    print(f"join/wait: tokens/s x{(jt / jw) / (wt / ww):.2f}, CPU s x{jc / wc:.2f}, "
          f"mean latency x{statistics.mean(jl) / statistics.mean(wl):.2f}; same sampled ids in every run: {same}")
    if a.small and not same:
        sys.exit("the two admission modes sampled different ids")


if __name__ == "__main__":
    main()
