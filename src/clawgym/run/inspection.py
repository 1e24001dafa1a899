"""`clawgym inspect PATH`: a readable summary of any artifact, model directory or run directory.

Parquet tables (calls, rollouts, trees) show their schema version, rows, columns and the statistics
a user checks first; JSONL logs show their records, keys and any torn line (transcripts.jsonl: its
rollouts and tool calls, or with --rollout one rollout's conversation); a model directory shows
its architecture, parameter count, vocabulary and whether its chat template renders a tool-using
conversation (the check the proxy makes at start, templates.py); a directory lists the artifacts it holds.
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path
from typing import Callable, Optional

import pyarrow.compute as pc
import pyarrow.parquet as pq
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clawgym import artifacts as A
from clawgym.errors import UserError
from clawgym.layout import RunLayout
from clawgym.models.templates import tool_use_problems
from clawgym.run import metrics as M, progress as P
from clawgym.trees import draw_tree


def inspect_path(path: Path, console: Console, *, rollout: Optional[str] = None, tokenizer: Optional[Path] = None) -> None:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / "config.json").exists():
            return inspect_model(path, console)
        run = RunLayout(path)
        if run.metrics.exists() or any(s.rollouts.exists() for s in run.steps()):
            return inspect_run(path, console)
        return inspect_directory(path, console)
    if path.suffix == ".parquet":
        kind = _parquet_kind(path)
        if kind not in _TABLES:
            raise UserError(f"{path}: not a clawgym table (metadata kind is {kind!r}; expected one of {', '.join(_TABLES)})")
        if rollout is not None and kind != "trees":
            raise UserError(f"--rollout applies to trees.parquet and transcripts.jsonl, not to a {kind} table")
        row_type, summarize = _TABLES[kind]
        table = A.read_arrow(path, row_type)
        _header(console, path, kind, table.num_rows, table.column_names)
        summarize(table, console)
        if kind == "trees" and rollout is not None:
            _draw_tree(table, rollout, console, tokenizer, path)
        return
    if path.suffix == ".jsonl":
        return inspect_jsonl(path, console, rollout=rollout)
    raise UserError(f"{path}: don't know how to inspect a '{path.suffix or 'suffix-less'}' file (expected .parquet, .jsonl or a directory)")


def _parquet_kind(path: Path) -> str | None:
    try:
        return A.file_kind(path)
    except Exception as e:
        raise A.ArtifactError(path, None, f"not a readable Parquet file ({e})") from None


def _header(console: Console, path: Path, kind: str, rows: int, columns: list[str]) -> None:
    meta = pq.read_schema(path).metadata or {}
    version = meta.get(b"schema_version", b"?").decode()
    console.print(f"[bold]{path}[/]  {kind} table, schema_version {version}, {rows:,} rows, {len(columns)} columns")
    console.print(f"[dim]columns: {', '.join(columns)}[/]")


def _kv_table(title: str, items: list[tuple[str, object]]) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("key", style="cyan")
    t.add_column("value")
    for k, v in items:
        t.add_row(k, f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    return t


def _counts(table, column: str) -> str:
    c = collections.Counter(table.column(column).to_pylist())
    return ", ".join(f"{k}: {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])) or "-"


def _list_tokens(table, column: str) -> int:
    return int(pc.sum(pc.list_value_length(table.column(column))).as_py() or 0)


def summarize_calls(table, console: Console) -> None:
    n = table.num_rows
    delta = n - table.column("prompt_base_call").null_count
    lp = pc.list_flatten(table.column("output_logprobs"))
    console.print(_kv_table("calls", [
        ("rollouts", len(set(table.column("rollout_id").to_pylist()))),
        ("calls", n),
        ("status", _counts(table, "status")),
        ("protocol", _counts(table, "protocol")),
        ("role", _counts(table, "role")),
        ("render mode", _counts(table, "render_mode")),
        ("prompts delta-encoded", f"{delta} of {n}"),
        ("prompt tokens stored", _list_tokens(table, "prompt_ids")),
        ("output tokens", _list_tokens(table, "output_ids")),
        ("mean output logprob", float(pc.mean(lp).as_py()) if len(lp) else "-"),
        ("policy versions", _counts(table, "policy_version")),
    ]))


def summarize_rollouts(table, console: Console) -> None:
    rows = A.read_table_rows(table, A.RolloutRecord)
    rewards = [r.reward for r in rows if r.reward is not None]
    console.print(_kv_table("rollouts", [
        ("rollouts", len(rows)),
        ("groups (task × harness)", len({r.group_id for r in rows})),
        ("status", _counts(table, "status")),
        ("mean reward", statistics.fmean(rewards) if rewards else "-"),
        ("rewards scored", f"{len(rewards)} of {len(rows)}"),
        ("mean calls per rollout", statistics.fmean(r.n_calls for r in rows) if rows else "-"),
        ("mean wall time (s)", statistics.fmean(r.wall_time_s for r in rows) if rows else "-"),
    ]))
    by_harness: dict[str, list[float]] = collections.defaultdict(list)
    for r in rows:
        if r.reward is not None:
            by_harness[r.harness].append(r.reward)
    if len(by_harness) > 1:
        t = Table("harness", "rollouts scored", "mean reward", title="per harness", title_justify="left")
        for h, rs in sorted(by_harness.items()):
            t.add_row(h, str(len(rs)), f"{statistics.fmean(rs):.3f}")
        console.print(t)
    by_node: dict[str, list[A.RolloutRecord]] = collections.defaultdict(list)
    for r in rows:
        by_node[r.node or "-"].append(r)
    if len(by_node) > 1:  # a Ray run: a node that fails more than its share stands out
        t = Table("node", "rollouts", "infra_error", "mean wall time (s)", title="per node", title_justify="left")
        for node, rs in sorted(by_node.items()):
            t.add_row(node, str(len(rs)), str(sum(r.status == "infra_error" for r in rs)),
                      f"{statistics.fmean(r.wall_time_s for r in rs):.1f}")
        console.print(t)


def summarize_trees(table, console: Console) -> None:
    lengths = pc.list_value_length(table.column("token_ids"))
    kind, role, kept = table.column("kind"), table.column("role"), table.column("kept")
    trainable = pc.and_(pc.and_(kept, pc.equal(kind, "model")), pc.equal(role, "main"))
    # node ids restart in every rollout: a leaf is a (rollout, node) that is nobody's parent there
    rids = table.column("rollout_id").to_pylist()
    parents = set(zip(rids, table.column("parent_id").to_pylist()))
    leaves = sum(1 for key in zip(rids, table.column("node_id").to_pylist()) if key not in parents)
    drops = collections.Counter(r for r in table.column("drop_reason").to_pylist() if r)
    console.print(_kv_table("trees", [
        ("rollouts", len(set(table.column("rollout_id").to_pylist()))),
        ("nodes", table.num_rows),
        ("leaves", leaves),
        ("tokens in trees", int(pc.sum(lengths).as_py() or 0)),
        ("model tokens", int(pc.sum(pc.if_else(pc.equal(kind, "model"), lengths, 0)).as_py() or 0)),
        ("trainable tokens", int(pc.sum(pc.if_else(trainable, lengths, 0)).as_py() or 0)),
        ("role", _counts(table, "role")),
        ("dropped nodes by reason", ", ".join(f"{k}: {v}" for k, v in drops.most_common()) or "none"),
    ]))


def _draw_tree(table, rollout: str, console: Console, tokenizer: Optional[Path], path: Path) -> None:
    sub = table.filter(pc.equal(table.column("rollout_id"), rollout))
    if sub.num_rows == 0:
        known = sorted(set(table.column("rollout_id").to_pylist()))[:5]
        raise UserError(f"{path}: no rollout '{rollout}' (some that exist: {', '.join(known)})")
    tok = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    draw_tree(A.read_table_rows(sub, A.TreeNode), console, tokenizer=tok)


_TABLES: dict[str, tuple[type, Callable]] = {
    "calls": (A.CallRecord, summarize_calls),
    "rollouts": (A.RolloutRecord, summarize_rollouts),
    "trees": (A.TreeNode, summarize_trees),
}


def inspect_jsonl(path: Path, console: Console, rollout: Optional[str] = None) -> None:
    read = A.read_jsonl(path)
    if read.records and read.records[0].get("kind") == A.Transcript.KIND:
        return inspect_transcripts(path, console, rollout)
    if rollout is not None:
        raise UserError(f"--rollout applies to trees.parquet and transcripts.jsonl, not to {path.name}")
    keys = collections.Counter(k for r in read.records for k in r)
    console.print(f"[bold]{path}[/]  JSONL log, {len(read.records):,} complete records")
    if read.torn:
        for t in read.torn:
            where = "last line (cut short by a crash)" if t.is_last else "a middle line (damaged file)"
            console.print(f"[yellow]torn line {t.line_no}[/], {where}: {t.text!r}")
    if read.records and "step" in keys and all(k.startswith(A.METRIC_PREFIXES) or k in ("step", "time") for k in keys):
        return _metrics_table(read.records, console)
    console.print(_kv_table("fields", [(k, f"in {v} records") for k, v in keys.most_common(30)]))


def inspect_transcripts(path: Path, console: Console, rollout: Optional[str] = None) -> None:
    """transcripts.jsonl: per rollout its source, messages and tool calls; with `rollout`, its conversation."""
    by_id = A.read_transcripts(path)
    if rollout is not None:
        t = by_id.get(rollout)
        if t is None:
            raise UserError(f"{path}: no rollout '{rollout}' (some that exist: {', '.join(sorted(by_id)[:5])})")
        return _print_conversation(t, console)
    console.print(f"[bold]{path}[/]  transcripts, schema_version {A.SCHEMA_VERSION}, {len(by_id):,} rollouts")
    table = Table("rollout", "harness", "source", "messages", "tool calls", "final answer", title_justify="left")
    for t in by_id.values():
        names = collections.Counter(c.name for m in t.messages for c in m.tool_calls)
        calls = ", ".join(f"{n}×{k}" for n, k in names.most_common(4)) or "-"
        final = "-" if t.final_answer is None else repr(t.final_answer[:40])
        table.add_row(t.rollout_id, t.harness, t.source, str(len(t.messages)), calls, final)
    console.print(table)


def _print_conversation(t: A.Transcript, console: Console) -> None:
    console.print(f"[bold]{t.rollout_id}[/]  {t.harness}, from {t.source}, {len(t.messages)} messages")
    for m in t.messages:
        head = {"user": "[cyan]user[/]", "assistant": "[green]assistant[/]", "tool": f"[yellow]tool {escape(m.tool_name)}[/]"}[m.role]
        if m.text:
            console.print(f"{head}: {escape(m.text[:300])}", highlight=False)
        for c in m.tool_calls:
            console.print(f"{head} calls [bold]{escape(c.name)}[/] {escape(json.dumps(c.arguments, ensure_ascii=False)[:200])}", highlight=False)
    console.print(escape(f"final answer: {t.final_answer!r}" if t.final_answer is not None else "final answer: (none)"), highlight=False)


def _metrics_table(records: list[dict], console: Console) -> None:
    cols = [k for k in dict.fromkeys(k for r in records for k in r) if k not in ("step", "time")][:12]
    t = Table("step", *cols, title="metrics per step", title_justify="left")
    for r in records:
        t.add_row(str(r["step"]), *(f"{r[c]:.4g}" if isinstance(r.get(c), (int, float)) else "-" for c in cols))
    console.print(t)


def inspect_model(path: Path, console: Console) -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    try:
        config = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path / 'config.json'}: not valid JSON ({e})") from None
    n_params = 0
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            for name in st.keys():
                n_params += _prod(st.get_slice(name).get_shape())
    try:
        tok = AutoTokenizer.from_pretrained(path)
        problems = tool_use_problems(tok)
        vocab = len(tok)
    except Exception as e:
        tok, vocab, problems = None, "-", [f"tokenizer does not load: {e}"]
    items = [
        ("architecture", ", ".join(config.get("architectures", [config.get("model_type", "?")]))),
        ("parameters", n_params),
        ("layers", config.get("num_hidden_layers", "-")),
        ("hidden size", config.get("hidden_size", "-")),
        ("heads / kv heads / head dim", f"{config.get('num_attention_heads')} / {config.get('num_key_value_heads')} / {config.get('head_dim')}"),
        ("context window", config.get("max_position_embeddings", "-")),
        ("vocabulary", vocab),
        ("dtype", config.get("dtype", config.get("torch_dtype", "-"))),
        ("chat template", "ok: renders tools, tool calls and tool results" if not problems else "; ".join(problems)),
    ]
    made = path / "clawgym.json"
    if made.exists():
        items.append(("made by", json.loads(made.read_text()).get("made_by", "-")))
    console.print(f"[bold]{path}[/]  model directory")
    console.print(_kv_table("model", items))


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# The per-step table of a run: (metric key, column title); per-harness rewards and Pass@1 are added as found.
RUN_COLUMNS = [
    (M.REWARD_MEAN, "reward"), (M.INFRA_ERRORS, "infra err"), ("trees/tree_token_ratio", "tree/calls"),
    ("train/loss", "loss"), ("train/entropy", "entropy"), ("train/mismatch_abs", "|Δlogp|"),
    ("trees/tokens_saved", "tree saved"), ("train/tokens_saved", "packing saved"),
    ("train/clip_frac", "clip"), (M.PASS_AT_1, "eval Pass@1 %"), (M.STEP_SECONDS, "step s"),
    (M.COLLECT.peak_key, "rollout GiB"), (M.OPTIMIZE.peak_key, "train GiB"), ("train/peak_gib", "train GiB"),
    (M.VERSION_MIN, "v min"), (M.VERSION_MAX, "v max"), (M.STALE_GROUPS, "stale groups"),
]


def _cell(key: str, value: float) -> str:
    """A run table's cell: Pass@1 in % as every table a person reads shows it (metrics.py, "Units"), the rest as is."""
    return f"{100 * value:.1f}" if key.endswith("pass@1") else f"{value:.4g}"


def inspect_run(path: Path, console: Console) -> None:
    """A run directory: one row per step, the cold start's line and the held-out table where the run
    has them, then where the plots are.

    A step's row is its metrics.jsonl lines (`clawgym run` writes one per step) over the figures
    read from the step's own files, so a run chained from the shell (recipes/pipeline.sh), which
    has no such lines, shows the same table; its eval/step-NNNN/eval.json adds the Pass@1."""
    run = RunLayout(path)
    rows: dict[int, dict[str, float]] = {}
    for sdir in run.steps():
        if sdir.rollouts.exists():
            rows[sdir.step] = M.step_values(sdir)
    for step, edir in run.evals():
        if edir.eval_json.exists():
            rows.setdefault(step, {}).update(M.eval_values(M.eval_figures(json.loads(edir.eval_json.read_text()))))
    if run.metrics.exists():
        for m in A.read_metrics(run.metrics):
            rows.setdefault(m.step, {}).update(m.values)
    lines = [A.MetricsLine(step, values) for step, values in sorted(rows.items())]
    keys = {k for m in lines for k in m.values}
    harness_cols = [(k, k.rsplit("/", 1)[1]) for k in sorted(keys) if k.startswith(f"{M.REWARD_MEAN}/")]
    # a mix-harness run's held-out Pass@1 per harness (eval/HARNESS/pass@1), after the pooled one
    eval_cols = [(k, f"eval {k.split('/')[1]} %") for k in sorted(keys) if k.startswith(M.EVAL) and k.endswith("/pass@1")
                 and k.count("/") == 2 and not k.startswith(M.EVAL_BASE)]
    i = next(i for i, (k, _) in enumerate(RUN_COLUMNS) if k == M.PASS_AT_1) + 1
    if M.OPTIMIZE.peak_key in keys:  # the whole train phase's peak (`clawgym run`) over train.jsonl's per-update one
        keys.discard("train/peak_gib")
    cols = [(k, title) for k, title in RUN_COLUMNS[:1] + harness_cols + RUN_COLUMNS[1:i] + eval_cols + RUN_COLUMNS[i:]
            if k in keys]
    t = Table("step", *(title for _, title in cols), title=f"run {path}", title_justify="left")
    for m in lines:
        t.add_row(str(m.step), *(_cell(k, m.values[k]) if k in m.values else "-" for k, _ in cols))
    console.print(t)
    zero = next((m.values for m in lines if m.step == 0 and M.TEACHER_N in m.values), None)
    if zero is not None:  # an [sft] cold start: its line, with each stage's seconds where the run recorded them
        console.print(P.cold_start_line(zero), highlight=False, soft_wrap=True)
    if run.table_md.exists():  # held-out Pass@1 by category: base, SFT, SFT+RL (coldstart.write_table)
        console.print(run.table_md.read_text().rstrip(), highlight=False, soft_wrap=True)
    plots = sorted(run.plots.glob("*.png")) if run.plots.is_dir() else []
    if plots:
        console.print("plots: " + ", ".join(str(p) for p in plots))


def inspect_directory(path: Path, console: Console) -> None:
    found = sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".jsonl") and not p.name.startswith("."))
    if not found:
        raise UserError(f"{path}: no clawgym artifacts (.parquet, .jsonl) or model (config.json) found")
    t = Table("file", "kind", "rows", title=f"artifacts in {path}", title_justify="left")
    for p in found:
        if p.suffix == ".parquet":
            try:
                kind, rows = A.file_kind(p) or "?", pq.read_metadata(p).num_rows
            except Exception:
                kind, rows = "unreadable", 0
        else:
            kind, rows = "jsonl", len(A.read_jsonl(p).records)
        t.add_row(str(p.relative_to(path)), kind, f"{rows:,}")
    console.print(t)
