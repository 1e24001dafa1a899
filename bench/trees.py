"""Benchmark build-trees on Claude-Code-like rollouts, against a naive build in the same run.

Each synthetic rollout has 50 calls: a 20k-token system+tools prefix shared by every main call, a
context that grows by a tool result and a model turn per call, 3 subagents of 3 calls each (their
own system prompt), 1 context compaction (summary call, then the main agent goes on from
system + summary), and 2 retries (a regenerated turn, and an engine error retried). Prompts are
delta-encoded the way the proxy stores them (the codec's rule, `artifacts.delta_encode_calls`: against
the call whose conversation it extends, or the latest call), written to calls.parquet, and `clawgym build-trees` runs on the
files in a fresh process, so time and peak RSS are the stage's own.

The baseline materialises every prompt (`artifacts.materialize_prompts`) and inserts the full
prompts; it is quadratic in the context length, so it runs on a sample of rollouts and its time
is extrapolated to all of them. Both builds must give the same trees on the sample.

    python bench/trees.py            # 1,000 rollouts x 50 calls (target: < 60 s, < 4 GiB)
    python bench/trees.py --small    # 50 rollouts with a 2k prefix, in seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from clawgym.artifacts import (
    CallRecord, RolloutRecord, delta_encode_calls, materialize_prompts, read_arrow, write_table,
)
from clawgym.trees import build_rollout_tree, read_trees, resolve_config, run_build_trees

import results_md  # bench/results_md.py: --write-results

VOCAB = 151_000


@dataclass
class Shape:
    rollouts: int = 1000
    prefix: int = 20_000
    """system prompt + tool definitions"""
    task: int = 300
    sub_prefix: int = 3_000
    """a subagent's own system prompt (shares only the template's first tokens with the main one)"""
    main_calls: int = 38
    compact_after: int = 20
    """the compaction call comes after this many main calls"""
    subagents_at: tuple[int, ...] = (5, 12, 28)
    sub_calls: int = 3
    regenerate_at: int = 8
    engine_error_at: int = 16
    summary: int = 1_500


def generate(shape: Shape, seed: int = 0) -> tuple[pa.Table, list[RolloutRecord]]:
    """The calls of every rollout, delta-encoded, as one table (built from flat numpy buffers)."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, VOCAB, shape.prefix, dtype=np.int32)
    rows: dict[str, list] = {k: [] for k in ("rollout_id", "call_id", "seq", "role", "status", "prompt_base_call",
                                             "prompt_base_len", "finish_reason")}
    tails: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    rollouts = []

    for r in range(shape.rollouts):
        rid = f"r{r:05d}"
        seq = 0
        totals: dict[str, int] = {}  # call_id -> prompt + output length

        def emit(role: str, base: str | None, base_len: int, tail: np.ndarray, output: np.ndarray, status: str = "ok") -> str:
            nonlocal seq
            call_id = f"{rid}-{seq:03d}"
            for k, v in (("rollout_id", rid), ("call_id", call_id), ("seq", seq), ("role", role), ("status", status),
                         ("prompt_base_call", base), ("prompt_base_len", base_len),
                         ("finish_reason", "stop" if status == "ok" else "error")):
                rows[k].append(v)
            tails.append(tail)
            outputs.append(output)
            totals[call_id] = base_len + len(tail) + len(output)
            seq += 1
            return call_id

        def tokens(n: int) -> np.ndarray:
            return rng.integers(0, VOCAB, n, dtype=np.int32)

        def turn() -> np.ndarray:  # a model turn: a tool call of ~150 tokens
            return tokens(int(rng.integers(60, 250)))

        def tool_result() -> np.ndarray:
            return tokens(int(rng.integers(50, 800)))

        # First main call: the whole prompt is stored.
        last = emit("main", None, 0, np.concatenate([system, tokens(shape.task)]), turn())
        first = last
        for k in range(1, shape.main_calls):
            if k in shape.subagents_at:
                # A subagent: own system prompt (shares the 8-token template header: under the
                # proxy's 16-token minimum, so stored in full), then a chain of its own calls.
                sub_prompt = np.concatenate([system[:8], tokens(shape.sub_prefix - 8), tokens(200)])
                sub = emit("subagent", None, 0, sub_prompt, turn())
                for _ in range(shape.sub_calls - 1):
                    sub = emit("subagent", sub, totals[sub], tool_result(), turn())
            if k == shape.compact_after:
                # The compaction call summarises the whole history; the main agent restarts from
                # system + task + summary, which shares only system + task with the first call.
                summary = tokens(shape.summary)
                emit("compaction", last, totals[last], tokens(100), summary)
                last = emit("main", first, shape.prefix + shape.task, np.concatenate([tokens(20), summary, tokens(30)]), turn())
                continue
            tail = tool_result()
            if k == shape.regenerate_at:
                # The turn is sampled, rejected by the harness (malformed tool call), sampled again.
                rejected = emit("main", last, totals[last], tail, turn())
                last = emit("main", rejected, totals[last] + len(tail), np.empty(0, np.int32), turn())
            elif k == shape.engine_error_at:
                failed = emit("main", last, totals[last], tail, np.empty(0, np.int32), status="engine_error")
                last = emit("main", failed, totals[failed], np.empty(0, np.int32), turn())
            else:
                last = emit("main", last, totals[last], tail, turn())
        rollouts.append(RolloutRecord(rid, f"task{r % 100}", "claude-code", f"task{r % 100}+claude-code", r // 100,
                                      "ok", float(rng.random() < 0.5), seq, 60.0, 0))

    n = len(tails)
    table = pa.table({
        "rollout_id": rows["rollout_id"], "call_id": rows["call_id"], "seq": rows["seq"],
        "protocol": ["anthropic"] * n, "model": ["policy"] * n, "started_at": np.zeros(n), "finished_at": np.zeros(n),
        "prompt_ids": _lists(tails, np.int32), "output_ids": _lists(outputs, np.int32),
        "output_logprobs": _lists([np.full(len(o), -0.5, np.float32) for o in outputs], np.float32),
        "finish_reason": rows["finish_reason"], "policy_version": np.zeros(n, np.int64),
        "prompt_base_call": rows["prompt_base_call"], "prompt_base_len": rows["prompt_base_len"],
        "role": rows["role"], "status": rows["status"], "error": [""] * n, "stream": [True] * n,
        "tool_names": pa.array([["Bash", "Read", "Edit", "Task"]] * n, pa.list_(pa.string())),
        "system_hash": ["abc123"] * n, "sampling_json": ["{}"] * n, "render_mode": ["incremental"] * n,
    })
    # columns the bench has no opinion on take CallRecord's defaults, so a column added later keeps it running
    defaults = {f.name: f.default for f in dataclasses.fields(CallRecord) if f.default is not dataclasses.MISSING}
    for field in CallRecord.SCHEMA:
        if field.name not in table.column_names:
            table = table.append_column(field, pa.array([defaults[field.name]] * n, field.type))
    return table, rollouts


def _lists(arrays: list[np.ndarray], dtype: type) -> pa.Array:
    offsets = np.zeros(len(arrays) + 1, np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(arrays).astype(dtype)))


def rollout_records(table: pa.Table, rollout_id: str) -> list[CallRecord]:
    rows = table.filter(pc.equal(table.column("rollout_id"), rollout_id)).to_pylist()
    return [CallRecord(**row) for row in rows]


# ---------------------------------------------------------------------------------------------


def stage_only(step_dir: str) -> None:
    """Run in a fresh process: the build-trees stage on step_dir, reporting time and peak RSS as JSON."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    stats = run_build_trees(resolve_config(Path(step_dir), None, None, None), Console(file=io.StringIO()))
    seconds = time.perf_counter() - started
    print(json.dumps({
        "seconds": seconds, "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "rss_before_kib": rss_before, "tree_tokens": stats.total("tree_tokens"),
        "call_tokens": stats.total("call_tokens"), "ratio": stats.tree_token_ratio,
        "nodes": stats.total("nodes"), "leaves": stats.total("leaves"), "segments": stats.total("segments"),
        "kept": stats.total("kept_leaves"), "dropped": stats.dropped_leaves,
        "trainable": stats.total("trainable_tokens"),
    }))


def naive(table: pa.Table, rollout_ids: list[str]) -> tuple[float, int, dict[str, int]]:
    """Materialise every prompt, then build from the full prompts: seconds, tracemalloc peak bytes, tree tokens."""
    seconds, peak, tree_tokens = 0.0, 0, {}
    for rid in rollout_ids:
        records = rollout_records(table, rid)
        tracemalloc.start()
        started = time.perf_counter()
        full = materialize_prompts(records)
        tree = build_rollout_tree(full)
        seconds += time.perf_counter() - started
        peak = max(peak, tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        tree_tokens[rid] = tree.stats.tree_tokens
        del full, tree
    return seconds, peak, tree_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="50 rollouts with a 2k-token prefix")
    parser.add_argument("--rollouts", type=int, help="number of rollouts (default 1000, or 50 with --small)")
    parser.add_argument("--naive-sample", type=int, default=5, help="rollouts the naive baseline builds")
    parser.add_argument("--stage-only", metavar="STEP_DIR", help=argparse.SUPPRESS)
    args = results_md.parse(parser)
    if args.stage_only:
        stage_only(args.stage_only)
        return

    shape = Shape(rollouts=50, prefix=2_000, sub_prefix=500, summary=300) if args.small else Shape()
    if args.rollouts:
        shape.rollouts = args.rollouts
    console = Console(width=max(Console().width, 110))
    with console.status(f"generating {shape.rollouts} rollouts x 50 calls"):
        started = time.perf_counter()
        table, rollouts = generate(shape)
        gen_seconds = time.perf_counter() - started
    if args.small:
        # The generator must store prompts exactly as the proxy's delta encoding would.
        for rid in (rollouts[0].rollout_id, rollouts[-1].rollout_id):
            ours = rollout_records(table, rid)
            proxy = delta_encode_calls(materialize_prompts(ours))
            assert [(c.prompt_base_call, c.prompt_base_len, c.prompt_ids) for c in ours] == \
                   [(c.prompt_base_call, c.prompt_base_len, c.prompt_ids) for c in proxy], rid
    stored = sum(pc.sum(pc.list_value_length(table.column(name))).as_py() for name in ("prompt_ids", "output_ids"))

    with tempfile.TemporaryDirectory(prefix="bench-trees-") as tmp:
        step = Path(tmp) / "step"
        step.mkdir()
        with console.status("writing calls.parquet"):
            write_table(step / "calls.parquet", table, CallRecord)
            write_table(step / "rollouts.parquet", rollouts, RolloutRecord)
        table = read_arrow(step / "calls.parquet", CallRecord)  # what the stage will read
        calls_mib = (step / "calls.parquet").stat().st_size / 2**20
        with console.status("clawgym build-trees (fresh process)"):
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--stage-only", str(step)], capture_output=True, text=True)
            process_seconds = time.perf_counter() - started
        if proc.returncode:
            sys.exit(f"build-trees failed:\n{proc.stderr}")
        fast = json.loads(proc.stdout.strip().splitlines()[-1])

        sample = [r.rollout_id for r in rollouts[:: max(1, len(rollouts) // args.naive_sample)]][: args.naive_sample]
        with console.status(f"naive baseline on {len(sample)} rollouts"):
            naive_seconds, naive_peak, naive_tokens = naive(table, sample)
        fast_trees = read_trees(step / "trees.parquet", set(sample))
        for rid in sample:
            got = sum(len(n.token_ids) for n in fast_trees[rid])
            assert got == naive_tokens[rid], f"{rid}: trees differ ({got} vs {naive_tokens[rid]} tokens)"

    n = shape.rollouts
    naive_total = naive_seconds / len(sample) * n
    out = Table(title=f"build-trees: {n:,} Claude-Code-like rollouts x 50 calls ({shape.prefix:,}-token prefix)")
    for col in ("build", "rollouts", "time (s)", "peak memory", "tree_token_ratio"):
        out.add_column(col, justify="left" if col == "build" else "right")
    out.add_row("build-trees (delta walk)", f"{n:,}", f"{fast['seconds']:.1f}",
                f"{fast['peak_rss_kib'] / 2**20:.2f} GiB RSS", f"{fast['ratio']:.4f}")
    out.add_row("naive (materialize prompts)", f"{len(sample)} built, x{n / len(sample):.0f}",
                f"~{naive_total:,.0f} (est.)", f"{naive_peak / 2**20:,.0f} MiB/rollout", f"{fast['ratio']:.4f}")
    console.print(out)
    console.print(
        f"speedup vs naive: {naive_total / fast['seconds']:.0f}x "
        f"(per rollout {fast['seconds'] / n * 1000:.1f} ms vs {naive_seconds / len(sample) * 1000:.0f} ms)\n"
        f"tokens: {fast['call_tokens']:,} in all calls' prompts+outputs, {stored:,} stored in calls.parquet "
        f"({calls_mib:,.0f} MiB), {fast['tree_tokens']:,} in the trees, {fast['trainable']:,} trainable\n"
        f"trees: {fast['nodes']:,} nodes, {fast['leaves']:,} leaves, {fast['segments']:,} segments, "
        f"{fast['kept']:,} trajectories kept; dropped leaves {', '.join(f'{k} {v:,}' for k, v in fast['dropped'].items() if v)}\n"
        f"process wall time {process_seconds:.1f} s (imports included); generating the calls took {gen_seconds:.1f} s; "
        f"targets: < 60 s {'met' if fast['seconds'] < 60 else 'MISSED'}, "
        f"< 4 GiB {'met' if fast['peak_rss_kib'] < 4 * 2**20 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
