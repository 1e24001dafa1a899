"""hf engine decode speed against what the machine allows.

    python3 bench/decode_speed.py --model smollm2-135m-instruct      # SmolLM2-135M (converted once, cached)
    python3 bench/decode_speed.py --small                            # tiny model, < 30 s

A decode step reads every weight once (tied embeddings once) and the cached keys and values: the
prompt the rows share once (the engine's shared-prefix attention), each row's own tokens per row. So
at small batch sizes a step cannot take less than (weight bytes + (shared + rows x own tokens) x
key/value bytes a token) / memory bandwidth; at large ones it cannot take less than
2 x parameters x rows / peak FLOP/s. The bench measures both rates here (the best of a few
single-pass reads of a 512 MB fp32 tensor, and of 2048^2 fp32 matmuls, each with 1 and with all
threads), so the limit is this machine's at this moment, then runs the hf engine at each --batch and
--context: that many requests with prompts of that length decoding --tokens tokens each at
temperature 1. At harness lengths (`--context 3500`, Claude Code's slim first prompt under SmolLM2)
the keys and values outweigh the weights from a few rows on. It prints
the engine's decode tokens/s (forward time only, from the engine's stats; and wall time,
sampling and Python included) and the ratio limit / measured, beside the same engine with
`weight_layout=rows` (plain linear layers: the baseline of the default oneDNN-packed weights,
src/clawgym/engines/weight_layout.py) and the same engine with `shared_attention=false` (the rows'
shared prompt read once per row, the baseline of src/clawgym/engines/shared_attention.py; past
--context 32 the rows share their whole prompt), run in turn at each batch size. Each run loads its
own engine and closes it before the next, and the machine's rates are measured in a thread that
ends, so one engine's OpenMP thread pool is the only one while it runs, as in a proxy process
(docs/engines.md, Threads). It also prints, for each weight shape of the model, the rate of a
product of 1 and of 8 rows over the model's own weights of that shape, plain and packed (all
threads, all the layers' matrices in turn, so each read comes from memory as in a decode step).
`--fixed-threads` runs every forward
with the most threads instead of the engine's choice per forward (docs/engines.md, Threads). The load average is printed before
and after: on a shared machine the ratio says as much about the neighbours as about the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import sys
import tempfile
import time
from pathlib import Path

from clawgym.engines.shared_attention import MIN_SHARED
from clawgym.models.pretrained import model_by_name

import results_md  # bench/results_md.py: --write-results


def machine(mb: int, n: int, small: bool = False) -> tuple[float, float]:
    """(read bandwidth bytes/s, fp32 matmul FLOP/s): the best over 1 and all threads (1 only if small)."""
    import torch

    most = torch.get_num_threads()
    a = torch.ones(mb * 2**20 // 4)
    x, y = torch.randn(n, n), torch.randn(n, n)
    bw = flops = 0.0
    try:
        for n_threads in [1] if small else sorted({1, most}):
            torch.set_num_threads(n_threads)
            for _ in range(5):
                t = time.perf_counter()
                a.sum()
                bw = max(bw, a.numel() * 4 / (time.perf_counter() - t))
            for _ in range(3):
                t = time.perf_counter()
                x @ y
                flops = max(flops, 2 * n**3 / (time.perf_counter() - t))
    finally:
        torch.set_num_threads(most)
    return bw, flops


async def decode(engine, batch: int, tokens: int, vocab: int, context: int = 32) -> tuple[float, float, int]:
    """(forward-only tokens/s, wall tokens/s, tokens) for `batch` requests decoding `tokens` each after a
    `context`-token prompt. Past 32 tokens every row has the same prompt (its own seed), so the prefix
    cache computes it once and each row decodes over its own copy of its keys and values."""
    from clawgym.engines import Sampling

    def prompt(i: int) -> list[int]:
        return [(7 * (0 if context > 32 else i) + j) % (vocab - 10) + 5 for j in range(context)]

    if context > 32:  # the prompt's blocks into the cache first, so the timed run below decodes, not prefills
        await engine.generate(prompt(0), Sampling(max_tokens=1, temperature=1.0, seed=0))
    before = engine.stats()
    t = time.perf_counter()
    gens = await asyncio.gather(*[engine.generate(prompt(i), Sampling(max_tokens=tokens, temperature=1.0, seed=i))
                                  for i in range(batch)])
    wall = time.perf_counter() - t
    after = engine.stats()
    n = sum(len(g.output_ids) for g in gens)
    fwd = (after["decode_tokens"] - before["decode_tokens"]) / max(1e-9, after["decode_seconds"] - before["decode_seconds"])
    return fwd, n / wall, n


def in_thread(fn, *args, **kwargs):
    """fn(*args, **kwargs) in a thread that ends: the OpenMP thread pool its torch work starts ends with it,
    so the engines measured next each run with the only pool (docs/engines.md, Threads)."""
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(fn, *args, **kwargs).result()


def layout_rates(model_dir: Path) -> list[tuple[tuple[int, int], list[tuple[int, float, float]]]]:
    """Per linear weight shape of the model: (shape, [(rows, GB/s plain, GB/s packed)]) for products of 1 and 8
    rows, all threads, over all the model's matrices of that shape in turn (each read from memory)."""
    import torch

    from clawgym.engines.base import load_policy
    from clawgym.engines.weight_layout import available, pack, packed_product

    model = load_policy(model_dir)
    by_shape: dict[tuple[int, int], list] = {}
    for m in model.modules():
        if type(m) is torch.nn.Linear and all(w is not m.weight for w in by_shape.get(tuple(m.weight.shape), [])):
            by_shape.setdefault(tuple(m.weight.shape), []).append(m.weight.detach())

    def rate(ws: list, rows: int, packed: bool) -> float:
        x = torch.randn(rows, ws[0].shape[1])
        mats = [pack(w) for w in ws] if packed else ws
        best = float("inf")
        with torch.inference_mode():
            for _ in range(3):
                t = time.perf_counter()
                for w in mats:
                    packed_product(x, w) if packed else torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - t)
        return sum(w.numel() * w.element_size() for w in ws) / best / 1e9

    if not available():
        return []
    return [(shape, [(r, rate(ws, r, False), rate(ws, r, True)) for r in (1, 8)]) for shape, ws in sorted(by_shape.items())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory or a `clawgym init-model --from` name (default: the tiny model)")
    ap.add_argument("--batch", default="1,4,8", help="comma-separated batch sizes")
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded per request")
    ap.add_argument("--context", default="32", help="comma-separated prompt lengths each batch decodes after "
                    "(3500: Claude Code's slim first prompt under SmolLM2)")
    ap.add_argument("--threads", type=int, help="the most torch threads (default: torch's)")
    ap.add_argument("--fixed-threads", action="store_true",
                    help="always the most threads (adaptive_threads=false): the baseline of the engine's thread choice")
    ap.add_argument("--small", action="store_true", help="tiny model, batches 1 and 2, 8 tokens; < 30 s")
    a = results_md.parse(ap)
    if a.small:
        a.model, a.batch, a.tokens = None, "1,2", 8
    import torch

    from clawgym.engines.hf import HFEngine

    load0 = os.getloadavg()[0]
    bw, flops = in_thread(machine, 32, 512, small=True) if a.small else in_thread(machine, 512, 2048)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = in_thread(model_by_name, a.model, Path(tmp))  # a conversion's torch work ends with its thread
        contexts = [int(x) for x in a.context.split(",")]
        variants = {"default": {}, "rows": {"weight_layout": "rows"}, "unshared": {"shared_attention": False}}

        def engine(variant: str):
            e = HFEngine(model_dir, max_batch=64, threads=a.threads, prefix_cache=max(contexts) > 32,
                         adaptive_threads=not a.fixed_threads, **variants[variant])
            e.eos_ids = ()  # decode the full budget: end-of-turn would cut rows short
            return e

        def measure(variant: str, b: int, ctx: int) -> tuple[float, float, int, dict]:
            """(forward tok/s, wall tok/s, tokens, the engine's thread timing) from a fresh engine, closed after."""
            e = engine(variant)
            try:
                asyncio.run(decode(e, 1, 4, vocab))  # warm-up
                fwd, wall, n = asyncio.run(decode(e, b, a.tokens, vocab, ctx))
                return fwd, wall, n, dict(e.tuner.ema)
            finally:
                asyncio.run(e.close())

        probe = engine("default")
        params = {id(p): p for p in probe.model.parameters()}.values()  # tied weights once
        weight_bytes = sum(p.numel() * p.element_size() for p in params)
        n_params = sum(p.numel() for p in params)
        cfg = probe.model.config
        shared_on = probe.shared_attention
        packed = sum(type(m) is not torch.nn.Linear for m in probe.model.modules() if isinstance(m, torch.nn.Linear))
        asyncio.run(probe.close())
        vocab = cfg.vocab_size
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_bytes = cfg.num_hidden_layers * 2 * getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) * head_dim * 4
        print(f"weights {weight_bytes / 2**20:.0f} MiB ({n_params:,} parameters); read bandwidth {bw / 1e9:.1f} GB/s, "
              f"fp32 matmul {flops / 1e9:.1f} GFLOP/s; load average {load0:.1f} on {os.cpu_count()} CPUs")
        print(f"linear layers packed for oneDNN by default: {packed}")
        print(f"keys and values: {kv_bytes / 2**10:.0f} KiB a token of context (fp32), read by every decode step: "
              f"the rows' shared prompt once{'' if shared_on else ' per row (shared attention is off for this model)'}")
        print("| batch | context | limit tok/s | decode tok/s (forward) | decode tok/s (wall) | limit / forward | bound by "
              "| weight_layout=rows: tok/s (forward) | default / rows | shared_attention=false: tok/s (forward) "
              "| default / unshared |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        ok = True
        timings = []
        for ctx in contexts:
            for b in [int(x) for x in a.batch.split(",")]:
                # a step reads every weight, the shared prompt's keys and values once and each row's own once,
                # and multiplies every weight per row
                shared = ctx if shared_on and b > 1 and ctx > 32 and ctx >= MIN_SHARED else 0
                read = weight_bytes + (shared + b * (ctx - shared + a.tokens // 2)) * kv_bytes
                step = max(read / bw, 2 * n_params * b / flops)
                limit = b / step
                fwd, wall, n, ema = measure("default", b, ctx)
                alt, _, m, _ = measure("rows", b, ctx)
                plain, _, k, _ = measure("unshared", b, ctx)
                ok &= n == m == k == b * a.tokens
                timings.append((b, ctx, ema))
                bound = "bandwidth" if read / bw >= 2 * n_params * b / flops else "FLOPs"
                print(f"| {b} | {ctx} | {limit:.1f} | {fwd:.1f} | {wall:.1f} | {limit / fwd:.2f} | {bound} | {alt:.1f} "
                      f"| {fwd / alt:.2f}x | {plain:.1f} | {fwd / plain:.2f}x |", flush=True)
        print("the default engine's own timing of each kind of forward and thread count (moving average, ms):")
        for b, ctx, ema in timings:
            print(f"  batch {b}, context {ctx}: " + "; ".join(
                f"{k} " + ", ".join(f"{n}: {v * 1e3:.1f}" for (kk, n), v in sorted(ema.items()) if kk == k)
                for k in sorted({k for k, _ in ema})))
        print("products over the model's own weights, all threads (GB/s; plain nn.Linear, and oneDNN-packed as the engine holds them):")
        for (o, i), rates in in_thread(layout_rates, model_dir):
            print(f"  [{o} x {i}]: " + "; ".join(f"{r} row{'s' if r > 1 else ''} plain {p:.1f}, packed {q:.1f} ({q / p:.2f}x)"
                                                 for r, p, q in rates))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
