#!/usr/bin/env bash
# recipes/retrain-offline.sh — retrain from a finished run's saved trees at another learning rate.
#
# A run keeps every step's rollouts and prefix trees (step-NNNN/{rollouts,trees}.parquet), so the
# optimizer can be replayed without a single rollout: this script trains a fresh copy of the run's
# starting policy over the same batches, step after step, with LR instead of the run's rate, and
# prints the run's and the replay's training figures side by side.
#
#     bash recipes/pipeline.sh                       # a finished run (recipes/runs/pipeline)
#     LR=0.01 bash recipes/retrain-offline.sh        # → recipes/runs/pipeline-lr0.01
#
# Step 1 starts from the same policy on the same batch, so its figures match the run's; later
# steps move apart as the policies do. The batches were sampled by the run's policies, so the
# replay is off-policy: its |Δlogp| to the sampling engine grows with the difference, and
# truncated importance sampling (train --tis) bounds its effect. Rerunning resumes.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FROM="${FROM:-$HERE/runs/pipeline}"        # the finished run (pipeline.sh's or `clawgym run`'s)
LR="${LR:-0.01}"                           # the learning rate to try
OUT="${OUT:-$FROM-lr$LR}"                  # where the replay writes its checkpoints
SEED="${SEED:-0}"                          # the run's seed: step k trains with seed SEED + k
ALGO="${ALGO:-grpo}"
MODEL="${MODEL:-$FROM/model-init}"         # the run's starting policy

[ -f "$MODEL/config.json" ] || { echo "error: $MODEL is not a model folder; set MODEL to the run's starting policy" >&2; exit 1; }

# The replay: one `clawgym train` per saved step, each starting from the previous replayed
# checkpoint, with the run's seed so that only the learning rate differs. The JSON result is kept
# as step-NNNN/train.json, written only when the call succeeded.
policy="$MODEL"
steps=()
for dir in "$FROM"/step-[0-9][0-9][0-9][0-9]; do
  [ -f "$dir/trees.parquet" ] || continue
  name="$(basename "$dir")"
  step=$((10#${name#step-}))
  mkdir -p "$OUT/$name"
  if [ ! -f "$OUT/$name/train.json" ]; then
    clawgym train --trees "$dir/trees.parquet" --rollouts "$dir/rollouts.parquet" --model "$policy" \
      --out "$OUT/checkpoints/$name" --metrics "$OUT/$name/train.jsonl" --algo "$ALGO" --lr "$LR" \
      --seed $((SEED + step)) --resume --json > "$OUT/$name/train.json.part"
    mv "$OUT/$name/train.json.part" "$OUT/$name/train.json"
  fi
  policy="$OUT/checkpoints/$name"
  steps+=("$name")
done
[ "${#steps[@]}" -gt 0 ] || { echo "error: $FROM has no step-NNNN/trees.parquet to retrain on" >&2; exit 1; }

# The comparison: each step's last update, from the run's train.jsonl and the replay's. (A step
# whose batch had nothing to learn, every group's rewards equal, made no update: "-".)
python3 - "$FROM" "$OUT" "${steps[@]}" <<'EOF'
import json, sys
from pathlib import Path

run, replay, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]

def last(path):
    lines = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
    return lines[-1] if lines else {}

def lr(folder):
    return json.loads((folder / "checkpoints" / steps[0] / "train_config.json").read_text())["lr"]

def get(row, key):
    value = row.get(key, row.get(f"train/{key}"))
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"

cols = [(f"{name} @{rate:g}", key, side) for name, key in (("loss", "loss"), ("entropy", "entropy"), ("|Δlogp|", "mismatch_abs"))
        for rate, side in ((lr(run), run), (lr(replay), replay))]
print(f"{'step':<10}" + "".join(f"{title:>16}" for title, _, _ in cols))
for name in steps:
    rows = {run: last(run / name / "train.jsonl"), replay: last(replay / name / "train.jsonl")}
    print(f"{name:<10}" + "".join(f"{get(rows[side], key):>16}" for _, key, side in cols))
print(f"replayed checkpoints: {replay / 'checkpoints'}")
EOF
