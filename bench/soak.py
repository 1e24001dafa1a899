"""Soak the serving proxy on loopback: many concurrent scripted rollouts of streaming calls.

R rollouts (default 200) run at once, each a conversation of C streaming Chat Completions calls
(default 20) made with the official `openai` async client against its own base URL and key, each
call sending the whole conversation so far (the proxy splices the sampled ids back, TITO). The
proxy runs as its own process (`clawgym serve-proxy --engine scripted`), so its RSS is measured
alone. Checked, not just timed:

- no errors: every call answers 200 with exactly the scripted text, with no client retries;
- no lost or duplicated records: each rollout's JSONL holds exactly C records, seq 0..C-1, unique
  call ids, all `ok`; nothing else is in the records folder;
- memory: the proxy's RSS sampled over time; the last quarter of the run vs the first.

Baseline in the same run: the same clients and workload against a bare aiohttp server that streams
the same chunks without rendering, an engine or records (the floor of HTTP + SSE + SDK on this
machine); the ratio is the proxy's own cost.

    python bench/soak.py                          # 200 rollouts x 20 calls; table + bench/results/soak*.{json,png}
    python bench/soak.py --rollouts 20 --calls 5  # a quick run

`tests/test_soak.py` runs a smaller soak through `soak()` and asserts the checks, never timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ also when a test loads this file
import results_md  # noqa: E402  bench/results_md.py: --write-results

FILLER = "the quick brown fox jumps over the lazy dog while the proxy records every token"


def expected(rollout: str, i: int) -> str:
    return f"reply {i} of {rollout}: {FILLER}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The baseline: a bare SSE server in the Chat Completions shape
# --------------------------------------------------------------------------------------------


def bare_server(port: int) -> None:
    """Stream the expected text for /r/{rollout}/v1/chat/completions; no render, engine or record."""
    from aiohttp import web

    counts: dict[str, int] = {}

    async def chat(request: web.Request) -> web.StreamResponse:
        rid = request.match_info["rollout"]
        await request.read()
        i = counts.get(rid, 0)
        counts[rid] = i + 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        base = {"id": f"c{i}", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        for delta, finish in (({"role": "assistant", "content": ""}, None), ({"content": expected(rid, i)}, None), ({}, "stop")):
            chunk = base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/r/{rollout}/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# --------------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    name: str
    calls: int
    errors: list[str]
    wall_s: float
    latencies: list[float] = field(repr=False)
    rss: list[tuple[float, int, float]] = field(default_factory=list, repr=False)
    """(seconds since start, calls finished, RSS MiB) of the server process"""

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s else 0.0

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    def rss_quarters(self) -> tuple[float, float, float]:
        """(mean RSS over the first quarter of calls, over the last quarter, peak) in MiB."""
        if not self.rss:
            return float("nan"), float("nan"), float("nan")
        total = max(c for _, c, _ in self.rss) or 1
        first = [m for _, c, m in self.rss if c <= total / 4] or [self.rss[0][2]]
        last = [m for _, c, m in self.rss if c >= 3 * total / 4] or [self.rss[-1][2]]
        return sum(first) / len(first), sum(last) / len(last), max(m for _, _, m in self.rss)


async def _rollout(base_url: str, key: str, rid: str, calls: int, result: RunResult, done: list[int]) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300.0)
    messages = [{"role": "system", "content": "You are a soak test."}, {"role": "user", "content": f"Start {rid}."}]
    try:
        for i in range(calls):
            t0 = time.perf_counter()
            text = ""
            try:
                stream = await client.chat.completions.create(model="m", messages=messages, stream=True, max_tokens=64)
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
            except Exception as e:  # every failure is counted and reported, none retried
                result.errors.append(f"{rid} call {i}: {type(e).__name__}: {e}"[:300])
                return
            result.latencies.append(time.perf_counter() - t0)
            if text != expected(rid, i):
                result.errors.append(f"{rid} call {i}: got {text[:80]!r}")
                return
            done[0] += 1
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"Next ({i + 1})."}]
    finally:
        await client.close()


def _sample_rss(pid: int, t0: float, done: list[int], out: list, stop: threading.Event, every: float) -> None:
    import psutil

    proc = psutil.Process(pid)
    while not stop.is_set():
        try:
            out.append((time.monotonic() - t0, done[0], proc.memory_info().rss / 2**20))
        except psutil.Error:
            return
        stop.wait(every)


async def _drive(name: str, url: str, keys: dict[str, str], calls: int, pid: int, sample_every: float) -> RunResult:
    result = RunResult(name, 0, [], 0.0, [])
    done, stop = [0], threading.Event()
    t0 = time.monotonic()
    sampler = threading.Thread(target=_sample_rss, args=(pid, t0, done, result.rss, stop, sample_every), daemon=True)
    sampler.start()
    await asyncio.gather(*(_rollout(f"{url}/r/{rid}/v1", key, rid, calls, result, done) for rid, key in keys.items()))
    result.wall_s = time.monotonic() - t0
    stop.set()
    sampler.join()
    result.calls = done[0]
    return result


# --------------------------------------------------------------------------------------------
# One soak: proxy and baseline
# --------------------------------------------------------------------------------------------


def _admin(url: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    import urllib.request

    req = urllib.request.Request(url + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _wait_up(url: str, proc: subprocess.Popen, probe, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            probe()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server at {url} did not come up in {timeout:.0f} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def check_records(records: Path, rollouts: list[str], calls: int) -> list[str]:
    """Every rollout has exactly `calls` ok records, seq 0..calls-1, unique call ids; nothing else."""
    from clawgym.artifacts import read_jsonl
    from clawgym.proxy import read_records

    problems = []
    files = sorted(p.name for p in records.iterdir())
    extra = set(files) - {f"{r}.jsonl" for r in rollouts}
    if extra:
        problems.append(f"unexpected files in records: {sorted(extra)[:5]}")
    call_ids: set[str] = set()
    for rid in rollouts:
        path = records / f"{rid}.jsonl"
        if not path.exists():
            problems.append(f"{rid}: no records")
            continue
        recs = read_records(path)
        torn = read_jsonl(path).torn
        if torn:
            problems.append(f"{rid}: {len(torn)} torn line(s)")
        if [r.seq for r in recs] != list(range(calls)):
            problems.append(f"{rid}: seqs {[r.seq for r in recs][:30]} (want 0..{calls - 1})")
        if any(r.status != "ok" for r in recs):
            problems.append(f"{rid}: statuses {sorted({r.status for r in recs})}")
        ids = {r.call_id for r in recs}
        if len(ids) != len(recs) or ids & call_ids:
            problems.append(f"{rid}: duplicated call ids")
        call_ids |= ids
    return problems


def soak(model: Path, rollouts: int = 200, calls: int = 20, *, baseline: bool = True, sample_every: float = 0.25,
         workdir: Path | None = None) -> dict:
    """Run the soak (and the baseline); returns a dict of results (see `report`)."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix="clawgym-soak-"))
    records = tmp / "records"
    ids = [f"soak-{i:04d}" for i in range(rollouts)]
    script = tmp / "script.jsonl"
    with open(script, "w") as f:
        for rid in ids:
            for i in range(calls):
                f.write(json.dumps({"rollout_id": rid, "text": expected(rid, i)}) + "\n")
    port, token = free_port(), "soak-admin-token"
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proxy = subprocess.Popen([sys.executable, "-m", "clawgym.cli", "serve-proxy", "--model", str(model), "--engine", "scripted",
                              "--script", str(script), "--port", str(port), "--records", str(records), "--admin-token", token,
                              "--max-context", "32768"], stdout=open(tmp / "proxy.log", "wb"), stderr=subprocess.STDOUT, env=env)
    out: dict = {"rollouts": rollouts, "calls_per_rollout": calls}
    try:
        _wait_up(url, proxy, lambda: _admin(url, token, "GET", "/admin/health"))
        keys = {rid: _admin(url, token, "POST", "/admin/rollouts", {"rollout_id": rid})["api_key"] for rid in ids}
        res = asyncio.run(_drive("proxy", url, keys, calls, proxy.pid, sample_every))
        # settle: every call's record is on disk once nothing is in flight
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            health = _admin(url, token, "GET", "/admin/health")
            if health["in_flight"] == 0:
                break
            time.sleep(0.1)
        out["proxy"] = res
        out["record_problems"] = check_records(records, ids, calls)
        out["records"] = sum(1 for p in records.glob("*.jsonl") for _ in open(p, "rb"))
    finally:
        _stop(proxy)
    if baseline:
        bport = free_port()
        bare = subprocess.Popen([sys.executable, __file__, "--bare-server", str(bport)], env=env,
                                stdout=subprocess.DEVNULL, stderr=open(tmp / "bare.log", "wb"))
        try:
            def probe() -> None:
                with socket.create_connection(("127.0.0.1", bport), timeout=1):
                    pass
            _wait_up(f"http://127.0.0.1:{bport}", bare, probe)
            out["baseline"] = asyncio.run(_drive("bare aiohttp SSE", f"http://127.0.0.1:{bport}",
                                                 {rid: "k" for rid in ids}, calls, bare.pid, sample_every))
        finally:
            _stop(bare)
    out["workdir"] = str(tmp)
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def report(out: dict, results_dir: Path | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    runs = [out["proxy"]] + ([out["baseline"]] if "baseline" in out else [])
    t = Table(title=f"soak: {out['rollouts']} concurrent rollouts x {out['calls_per_rollout']} streaming calls (loopback)")
    for col in ("server", "calls ok", "errors", "wall s", "calls/s", "p50 ms", "p99 ms", "RSS first¼ MiB", "RSS last¼ MiB", "RSS peak MiB"):
        t.add_column(col, justify="right" if col != "server" else "left")
    for r in runs:
        first, last, peak = r.rss_quarters()
        t.add_row(r.name, str(r.calls), str(len(r.errors)), f"{r.wall_s:.1f}", f"{r.calls_per_s:.0f}", f"{r.pct(0.5) * 1e3:.1f}",
                  f"{r.pct(0.99) * 1e3:.1f}", f"{first:.0f}", f"{last:.0f}", f"{peak:.0f}")
    console.print(t)
    p = out["proxy"]
    if "baseline" in out:
        b = out["baseline"]
        console.print(f"proxy / bare: calls/s x{p.calls_per_s / b.calls_per_s:.2f}, p50 x{p.pct(0.5) / b.pct(0.5):.2f}, "
                      f"p99 x{p.pct(0.99) / b.pct(0.99):.2f}")
    console.print(f"records: {out['records']} lines for {p.calls} calls; problems: {out['record_problems'] or 'none'}")
    # RSS over time, by tenths of the run
    if p.rss:
        rt = Table(title="proxy RSS over time")
        rt.add_column("t s", justify="right")
        rt.add_column("calls done", justify="right")
        rt.add_column("RSS MiB", justify="right")
        step = max(1, len(p.rss) // 10)
        for t_s, c, m in p.rss[::step] + ([p.rss[-1]] if (len(p.rss) - 1) % step else []):
            rt.add_row(f"{t_s:.1f}", str(c), f"{m:.0f}")
        console.print(rt)
    for r in runs:
        for e in r.errors[:5]:
            console.print(f"[red]{r.name} error:[/] {e}")
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        summary = {"rollouts": out["rollouts"], "calls_per_rollout": out["calls_per_rollout"], "records": out["records"],
                   "record_problems": out["record_problems"]}
        for r in runs:
            first, last, peak = r.rss_quarters()
            summary[r.name] = {"calls": r.calls, "errors": len(r.errors), "wall_s": r.wall_s, "calls_per_s": r.calls_per_s,
                               "p50_ms": r.pct(0.5) * 1e3, "p99_ms": r.pct(0.99) * 1e3, "rss_first_quarter_mib": first,
                               "rss_last_quarter_mib": last, "rss_peak_mib": peak, "rss": r.rss}
        (results_dir / "soak.json").write_text(json.dumps(summary, indent=1))
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        for r in runs:
            ax.plot([x[0] for x in r.rss], [x[2] for x in r.rss], label=r.name)
        ax.set_xlabel("seconds")
        ax.set_ylabel("RSS (MiB)")
        ax.set_title(f"server RSS: {out['rollouts']} rollouts x {out['calls_per_rollout']} streaming calls")
        ax.set_ylim(bottom=0)
        ax.legend()
        fig.tight_layout()
        fig.savefig(results_dir / "soak_rss.png", dpi=110)
        console.print(f"wrote {results_dir / 'soak.json'} and {results_dir / 'soak_rss.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model dir (default: a fresh init-model tiny in a temp dir)")
    ap.add_argument("--rollouts", type=int, default=200)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--results", default=str(Path(__file__).parent / "results"), help="folder for soak.json and soak_rss.png")
    ap.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--small", action="store_true", help="a correctness run in seconds: 8 rollouts x 4 calls, no baseline, "
                                                         "figures in a temporary folder")
    args = results_md.parse(ap)
    if args.small:
        args.rollouts, args.calls, args.no_baseline = 8, 4, True
        args.results = tempfile.mkdtemp(prefix="clawgym-soak-small-")
    if args.bare_server:
        bare_server(args.bare_server)
        return
    model = Path(args.model) if args.model else None
    if model is None:
        from clawgym.models.tiny import init_model

        model = Path(tempfile.mkdtemp(prefix="clawgym-soak-model-")) / "tiny"
        init_model(model, seed=0, size="tiny")
    out = soak(model, args.rollouts, args.calls, baseline=not args.no_baseline)
    report(out, Path(args.results))
    import shutil

    shutil.rmtree(out["workdir"], ignore_errors=True)  # the records were checked; keep only the figures
    if not args.model:
        shutil.rmtree(model.parent, ignore_errors=True)
    bad = out["proxy"].errors or out["record_problems"] or out["proxy"].calls != args.rollouts * args.calls
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
