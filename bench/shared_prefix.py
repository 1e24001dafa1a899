"""How much of the first prompt two rollouts of one task share, per real harness.

Two rollouts of the same task (one GRPO group) run through the rollout runner with the real
harness binaries, the tiny model's tokenizer behind the proxy and a scripted engine (the model's
answer does not matter: only the first call's prompt is compared, and the harness sends it before
any answer). The table shows each rollout's first-prompt length, the tokens the two prompts share
from the start, and the text where they part. Everything a group shares can be forwarded once per
group by the trainer and cached once by the engine; the rest is forwarded per rollout.

    python bench/shared_prefix.py                              # claude-code, claude-code-full, openclaw
    python bench/shared_prefix.py --harness claude-code        # one of them
    PYTHONPATH=/path/to/other/checkout/src python bench/shared_prefix.py   # the same on other code

`claude-code` is the adapter's default (a one-line system prompt); `claude-code-full` keeps Claude
Code's own long system prompt (`bare = false`). The sandbox is the runner's default (`local`,
network `auto`: bubblewrap where permitted). Harnesses that are not installed are skipped with the
adapter's reason (`clawgym harness install NAME`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from clawgym import artifacts as A
from clawgym.models.tiny import init_model
from clawgym.rollout.harnesses import HARNESSES
from clawgym.rollout.runner import RolloutConfig, run_rollouts

import results_md  # bench/results_md.py: --write-results

INSTRUCTION = "Create a file out.txt containing hi by running a shell command."
CHECK = "import json, sys, pathlib\nprint(json.dumps({'out': (pathlib.Path(sys.argv[1]) / 'out.txt').exists()}))\n"
# row name -> (adapter, adapter options)
VARIANTS = {
    "claude-code": ("claude-code", {}),
    "claude-code-full": ("claude-code", {"bare": False}),
    "openclaw": ("openclaw", {}),
}


def make_task(root: Path, instruction: str) -> None:
    d = root / "hello"
    (d / "tests").mkdir(parents=True)
    (d / "workspace").mkdir()
    (d / "workspace" / "README.md").write_text("seed file\n")
    (d / "task.toml").write_text('[metadata]\nid = "hello"\ncategory = "files"\n\n[agent]\ntimeout_sec = 420\n')
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "tests" / "check.py").write_text(CHECK)


def measure(name: str, work: Path, model: Path, tokenizer) -> dict:
    """Two rollouts of the task with one harness variant; their first prompts compared."""
    harness, options = VARIANTS[name]
    out = work / f"out-{name}"
    script = work / f"script-{name}.jsonl"
    rids = [f"hello.{harness}.{i}" for i in range(2)]
    with open(script, "w") as f:  # a final answer on every call: the harness stops after one turn
        for rid in rids:
            for _ in range(4):
                f.write(json.dumps({"rollout_id": rid, "text": "Done."}) + "\n")
    config = RolloutConfig(tasks=work / "tasks", harnesses=[harness], out=out, group_size=2, concurrency=2, model=model,
                           engine="scripted", engine_options={"script": str(script)}, harness_options={harness: options})
    t0 = time.monotonic()
    run_rollouts(config)
    calls = A.materialize_prompts(A.read_table(out / "calls.parquet", A.CallRecord))
    first = {}
    for c in sorted(calls, key=lambda c: c.seq):
        first.setdefault(c.rollout_id, c)
    missing = [r for r in rids if r not in first]
    if missing:
        raise SystemExit(f"{name}: no call recorded for {', '.join(missing)} (see {out})")
    a, b = (first[r].prompt_ids for r in rids)
    n = A.common_prefix(a, b)
    where = "identical" if n == len(a) == len(b) else repr(tokenizer.decode(a[max(0, n - 12): n + 6]))
    # what the proxy rewrote before tokenizing, as sent (absent on code without the normalization)
    sent = [json.loads(getattr(first[r], "normalized_json", "{}")).get("billing_header", "") for r in rids]
    return {"name": name, "len_a": len(a), "len_b": len(b), "shared": n, "where": where,
            "billing": " / ".join(s.rsplit("=", 1)[-1] for s in sent if s) or "-", "wall_s": time.monotonic() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--harness", action="append", choices=list(VARIANTS), help="a row to measure (repeatable; default all)")
    ap.add_argument("--instruction", default=INSTRUCTION, help="the task's instruction")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines too")
    ap.add_argument("--small", action="store_true", help="the claude-code row only, checked to share a prefix "
                                                         "(exits 0 with a note when the harness is not installed)")
    args = results_md.parse(ap, argv)
    if args.small:
        args.harness = ["claude-code"]
    from transformers import AutoTokenizer

    import clawgym

    rows = []
    with tempfile.TemporaryDirectory(prefix="clawgym-prefix-") as tmp:
        work = Path(tmp)
        make_task(work / "tasks", args.instruction)
        init_model(work / "model", seed=0, size="tiny")
        tokenizer = AutoTokenizer.from_pretrained(work / "model")
        for name in args.harness or list(VARIANTS):
            why = HARNESSES[VARIANTS[name][0]]().missing()
            if why is not None:
                print(f"{name}: skipped: {why}", file=sys.stderr)
                continue
            rows.append(measure(name, work, work / "model", tokenizer))
    table = Table(title=f"shared prefix of two rollouts' first prompts (clawgym from {Path(clawgym.__file__).parent})")
    for col in ("harness", "prompt tokens", "shared prefix", "shared %", "first difference (rollout 0)", "cc_version as sent", "wall s"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], f"{r['len_a']} / {r['len_b']}", str(r["shared"]),
                      f"{100 * r['shared'] / max(r['len_a'], r['len_b']):.1f}", r["where"], r["billing"], f"{r['wall_s']:.0f}")
    Console(width=200).print(table)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    if args.small:  # correctness only: two rollouts of one task share the start of their first prompt
        return 0 if all(r["shared"] > 0 for r in rows) else 1
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
