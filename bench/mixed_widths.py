"""hf engine bench: rollouts of harnesses with short and long prompts, interleaved vs grouped.

    python3 bench/mixed_widths.py --model smollm2-135m-instruct    # SmolLM2 (converted once, cached)
    python3 bench/mixed_widths.py --small                          # a correctness run in seconds

A mix-harness step or evaluation runs rollouts of harnesses whose prompts differ tenfold in length
(agentloop's first prompt is a few hundred tokens, Codex's several thousand). The hf engine keeps
one batch whose rows are right-aligned in one cache, so every row's decode step attends over the
widest row's columns (the rest masked padding): a short-prompt rollout batched with long ones costs
what a long one costs. This bench sends --rollouts rollouts of --calls calls each, with at most
--concurrency in flight (as the rollout runner does), half with a --short prompt and half with a
--long one (each group sharing its prompt's first part, as a harness's system prompt is shared and
the prefix cache computes it once), in two orders:

- `interleaved` (baseline): short, long, short, long, ... (the runner's order before it grouped
  rollouts by harness, task by task through the harnesses);
- `grouped`: all short ones, then all long ones (the runner's order now: harness by harness).

Each call samples --max-tokens tokens at temperature 1 with its own seed; a rollout's next call is
its prompt + what it sampled + a few new tokens. It prints the wall time and the process's CPU time
of each order, the mean call latency per prompt kind, and the grouped/interleaved ratios, and
whether both orders sampled the same ids (batching changes a seeded sample only by float rounding).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from clawgym.engines import Sampling
from clawgym.engines.hf import HFEngine
from clawgym.models.pretrained import model_by_name

import results_md  # bench/results_md.py: --write-results


async def run(engine: HFEngine, order: list[int], prompts: dict[int, list[int]], a) -> tuple[float, float, dict, dict]:
    """Run the rollouts in `order`, at most a.concurrency at once: (wall s, CPU s, latencies by kind, ids by rollout)."""
    t0, c0 = time.perf_counter(), time.process_time()
    gate = asyncio.Semaphore(a.concurrency)
    latencies: dict[str, list[float]] = {"short": [], "long": []}
    ids: dict[int, list[list[int]]] = {}

    async def rollout(r: int) -> None:
        async with gate:
            prompt, kind = list(prompts[r]), "short" if r % 2 == 0 else "long"
            ids[r] = []
            for c in range(a.calls):
                start = time.perf_counter()
                g = await engine.generate(prompt, Sampling(max_tokens=a.max_tokens, temperature=1.0, seed=1000 * r + c))
                latencies[kind].append(time.perf_counter() - start)
                ids[r].append(g.output_ids)
                prompt = prompt + g.output_ids + [11 + (r + c) % 50] * 8  # the harness's next turn: a tool result

    # tasks are created in `order`, so they take the semaphore in that order
    await asyncio.gather(*[rollout(r) for r in order])
    return time.perf_counter() - t0, time.process_time() - c0, latencies, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory or a `clawgym init-model --from` name (default: tiny)")
    ap.add_argument("--rollouts", type=int, default=16, help="rollouts, half short and half long")
    ap.add_argument("--calls", type=int, default=3, help="calls per rollout")
    ap.add_argument("--concurrency", type=int, default=8, help="rollouts in flight (the recipes' [rollout] concurrency)")
    ap.add_argument("--short", type=int, default=300, help="the short prompts' tokens (agentloop's first prompt)")
    ap.add_argument("--long", type=int, default=5700, help="the long prompts' tokens (Codex's first prompt)")
    ap.add_argument("--max-tokens", type=int, default=25, help="tokens per call (the recipes' calls average about 25)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--small", action="store_true", help="a correctness run in seconds: 4 rollouts of 2 calls, "
                                                         "16- and 96-token prompts; exits 1 unless both orders sampled the same ids")
    a = results_md.parse(ap)
    if a.small:
        a.rollouts, a.calls, a.concurrency, a.short, a.long, a.max_tokens = 4, 2, 2, 16, 96, 4
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = model_by_name(a.model, Path(tmp))
        engines = {order: HFEngine(path, max_batch=a.concurrency, threads=a.threads) for order in ("interleaved", "grouped")}
        vocab = engines["grouped"].model.config.vocab_size
        common = {kind: [rng.randrange(10, vocab - 10) for _ in range(n * 9 // 10)]
                  for kind, n in (("short", a.short), ("long", a.long))}
        prompts = {}
        for r in range(a.rollouts):
            kind, n = ("short", a.short) if r % 2 == 0 else ("long", a.long)
            prompts[r] = common[kind] + [rng.randrange(10, vocab - 10) for _ in range(n - len(common[kind]))]
        orders = {"interleaved": list(range(a.rollouts)),
                  "grouped": [r for r in range(a.rollouts) if r % 2 == 0] + [r for r in range(a.rollouts) if r % 2 == 1]}
        print(f"model {path.name}: {a.rollouts} rollouts x {a.calls} calls, {a.concurrency} in flight, "
              f"prompts of {a.short} and {a.long} tokens (each kind sharing its first 90%), {a.max_tokens} tokens a call")
        for e in engines.values():  # warm-up (first forwards are slow) and each kind's shared part cached, alike for both
            for kind in ("short", "long"):
                asyncio.run(e.generate(common[kind] + [12], Sampling(max_tokens=2, temperature=0.0)))
        res = {order: asyncio.run(run(engines[order], orders[order], prompts, a)) for order in ("interleaved", "grouped")}
        for e in engines.values():
            asyncio.run(e.close())
    print(f"{'order':12} {'wall s':>8} {'CPU s':>8} {'short call s':>13} {'long call s':>12}")
    for order, (wall, cpu, lat, _) in res.items():
        print(f"{order:12} {wall:8.1f} {cpu:8.1f} {statistics.mean(lat['short']):13.2f} {statistics.mean(lat['long']):12.2f}")
    (iw, ic, il, iids), (gw, gc, gl, gids) = res["interleaved"], res["grouped"]
    same = iids == gids
    print(f"grouped/interleaved: wall x{gw / iw:.2f}, CPU s x{gc / ic:.2f}, short-call latency "
          f"x{statistics.mean(gl['short']) / statistics.mean(il['short']):.2f}; same sampled ids in both orders: {same}")
    if a.small and not same:
        sys.exit("the two orders sampled different ids")


if __name__ == "__main__":
    main()
