"""Benchmark the serving proxy against baselines measured in the same run, and print the ratios.

1. Added latency per call: a 2-turn tool conversation sent through the proxy over HTTP (Anthropic
   Messages, non-streaming, scripted engine) vs the same prompt ids given to the engine directly.
2. Throughput: calls/s with N concurrent streaming clients through the proxy vs N concurrent
   direct engine calls (the proxy's own ceiling: render + HTTP + SSE + records).
3. Rendering at turn T of a long conversation (default: turn 100, ~30k tokens): the incremental
   render (only the new turn is rendered and tokenized) vs a full re-render of the same request.
4. Record size: the rollout's JSONL with delta-encoded prompts vs the same records with full prompts.

    python bench/proxy.py                   # the numbers quoted in the issue
    python bench/proxy.py --quick           # a smaller run, in seconds
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from rich.console import Console
from rich.table import Table

from clawgym.engines.base import Sampling
from clawgym.proxy import ProxyConfig, ProxyServer
from clawgym.proxy.render import RolloutTito
from clawgym.proxy.toolparse import HermesParser
from clawgym.proxy.types import Message, ToolSpec

import results_md  # bench/results_md.py: --write-results

TOOL_TEXT = 'Running.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls -la src"}}\n</tool_call>'
TOOLS = [{"name": "Bash", "description": "Run a shell command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def latency(server: ProxyServer, url: str, n: int) -> tuple[list[float], list[float]]:
    """Per-call wall time through the proxy vs direct engine.generate on the same prompt ids."""
    engine, direct, proxied = server.engine, [], []
    async with aiohttp.ClientSession() as http:
        for i in range(n):
            r = server.register(f"lat{i}")
            engine.push(r.id, [TOOL_TEXT, "Done."])
            body = {"model": "m", "max_tokens": 256, "tools": TOOLS, "system": "You are a coding agent.",
                    "messages": [{"role": "user", "content": "List the files in src."}]}
            headers = {"x-api-key": r.api_key}
            t = time.perf_counter()
            async with http.post(f"{url}/r/{r.id}/v1/messages", json=body, headers=headers) as resp:
                first = await resp.json()
            proxied.append(time.perf_counter() - t)
            body["messages"] += [{"role": "assistant", "content": first["content"]},
                                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first["content"][-1]["id"],
                                                               "content": "a.py b.py"}]}]
            t = time.perf_counter()
            async with http.post(f"{url}/r/{r.id}/v1/messages", json=body, headers=headers) as resp:
                await resp.json()
            proxied.append(time.perf_counter() - t)
            # Baseline: the engine alone, on the prompt the proxy rendered for this call.
            prompt = r.tito.nodes[next(reversed(r.tito.nodes))]
            ids = prompt.chain[: prompt.length]
            engine.push("direct", [TOOL_TEXT, "Done."])
            for _ in range(2):
                t = time.perf_counter()
                await engine.generate(ids, Sampling(max_tokens=256, stop_token_ids=server.renderer.stop_ids), "direct")
                direct.append(time.perf_counter() - t)
    return direct, proxied


async def throughput(server: ProxyServer, url: str, clients: int, per_client: int) -> tuple[float, float]:
    engine = server.engine
    engine.push("*", ["Fine, done."] * (clients * per_client * 2))

    async def direct_client() -> None:
        for _ in range(per_client):
            await engine.generate([1, 2, 3] * 50, Sampling(max_tokens=64), "tp-direct")
            await asyncio.sleep(0)  # let the others run, as a server would

    t = time.perf_counter()
    await asyncio.gather(*[direct_client() for _ in range(clients)])
    direct_rate = clients * per_client / (time.perf_counter() - t)

    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn) as http:
        regs = [server.register(f"tp{i}") for i in range(clients)]

        async def client(r) -> None:
            for j in range(per_client):
                body = {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": f"hello {j}"}]}
                async with http.post(f"{url}/r/{r.id}/v1/messages", json=body, headers={"x-api-key": r.api_key}) as resp:
                    data = await resp.read()
                    assert b"message_stop" in data, data[-300:]

        t = time.perf_counter()
        await asyncio.gather(*[client(r) for r in regs])
        proxy_rate = clients * per_client / (time.perf_counter() - t)
    return direct_rate, proxy_rate


def long_conversation(server: ProxyServer, turns: int, tool_output_chars: int):
    """Drive a RolloutTito through `turns` tool turns; returns (tito, messages, record sizes delta/full)."""
    tok = server.tokenizer
    tito = RolloutTito(server.renderer)
    tools = [ToolSpec("Bash", "Run a shell command", TOOLS[0]["input_schema"])]
    msgs = [Message("system", "You are a coding agent. " * 40), Message("user", "Refactor the project.")]
    delta_bytes = full_bytes = 0
    filler = ("lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt. " * 200)[:tool_output_chars]
    for i in range(turns):
        plan = tito.render(msgs, tools)
        tito.commit(plan, f"c{i}")
        text = f"Step {i}.\n<tool_call>\n{{\"name\": \"Bash\", \"arguments\": {{\"command\": \"cat file{i}.py\"}}}}\n</tool_call>"
        out = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids + [tok.eos_token_id]
        parsed = HermesParser().parse(text)
        tito.add_completion(f"c{i}", parsed.text, parsed.tool_calls, out)
        rec = {"prompt_ids": plan.delta.tail(plan.prompt_ids), "output_ids": out, "output_logprobs": [0.0] * len(out),
               "prompt_base_call": plan.delta.base_call, "prompt_base_len": plan.delta.base_len}
        delta_bytes += len(orjson.dumps(rec)) + 1
        full_bytes += len(orjson.dumps(rec | {"prompt_ids": plan.prompt_ids, "prompt_base_call": None, "prompt_base_len": 0})) + 1
        msgs = msgs + [Message("assistant", parsed.text, parsed.tool_calls), Message("tool", f"# file{i}.py\n" + filler)]
    return tito, msgs, tools, delta_bytes, full_bytes


def render_timing(server: ProxyServer, tito: RolloutTito, msgs, tools, reps: int) -> tuple[float, float, int]:
    inc, full, n = [], [], 0
    for _ in range(reps):
        t = time.perf_counter()
        plan = tito.render(msgs, tools)
        inc.append(time.perf_counter() - t)
        assert plan.mode == "incremental"
        fresh = RolloutTito(server.renderer)  # same completions, no conversation to extend
        fresh.completions, fresh.by_call = tito.completions, tito.by_call
        t = time.perf_counter()
        ref = fresh.render(msgs, tools)
        full.append(time.perf_counter() - t)
        assert ref.mode == "full" and ref.prompt_ids == plan.prompt_ids  # same tokens either way
        n = len(plan.prompt_ids)
    return statistics.median(inc), statistics.median(full), n


async def main(args: argparse.Namespace) -> None:
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(args.model) if args.model else Path(tmp) / "tiny"
        if not args.model:
            from clawgym.models.tiny import init_model

            init_model(model, seed=0, size="tiny")
        server = ProxyServer(ProxyConfig(model_dir=model, engine="scripted", port=0, records_dir=Path(tmp) / "records",
                                         max_context=1 << 20))
        url = await server.start()
        try:
            direct, proxied = await latency(server, url, args.calls)
            d_rate, p_rate = await throughput(server, url, args.clients, args.per_client)
            tito, msgs, tools, delta_b, full_b = long_conversation(server, args.turns, args.tool_chars)
            inc, full, n_tokens = render_timing(server, tito, msgs, tools, args.reps)
        finally:
            await server.stop()
    table = Table(title=f"serve-proxy (scripted engine, {sys.platform}, {args.calls} conversations, "
                        f"{args.clients} clients x {args.per_client} calls)")
    for col in ("measure", "proxy", "baseline", "ratio"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
    p50d, p50p, p99d, p99p = pct(direct, .5), pct(proxied, .5), pct(direct, .99), pct(proxied, .99)
    table.add_row("latency p50 (added)", f"{ms(p50p)} (+{ms(p50p - p50d)})", f"{ms(p50d)} engine direct", f"{p50p / p50d:.1f}x")
    table.add_row("latency p99 (added)", f"{ms(p99p)} (+{ms(p99p - p99d)})", f"{ms(p99d)} engine direct", f"{p99p / p99d:.1f}x")
    table.add_row(f"calls/s, {args.clients} streaming clients", f"{p_rate:.0f}", f"{d_rate:.0f} engine direct", f"{p_rate / d_rate:.3f}x")
    table.add_row(f"render at turn {args.turns} ({n_tokens:,} tokens)", ms(inc), f"{ms(full)} full re-render", f"{full / inc:.0f}x faster")
    table.add_row(f"record bytes, {args.turns} calls", f"{delta_b:,} delta", f"{full_b:,} full prompts", f"{full_b / delta_b:.0f}x smaller")
    console.print(table)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model dir (default: a fresh init-model tiny in a temp dir)")
    ap.add_argument("--calls", type=int, default=100, help="conversations for the latency measure (2 calls each)")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--per-client", type=int, default=5)
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--tool-chars", type=int, default=400, help="characters of each tool output (sets the context size)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="20 conversations, 50 clients x 2, turn 30")
    ap.add_argument("--small", action="store_true", help="a correctness run in seconds: 4 conversations, 8 clients x 1, turn 6")
    a = results_md.parse(ap)
    if a.small:
        a.calls, a.clients, a.per_client, a.turns, a.reps = 4, 8, 1, 6, 1
    elif a.quick:
        a.calls, a.clients, a.per_client, a.turns, a.reps = 20, 50, 2, 30, 3
    asyncio.run(main(a))
