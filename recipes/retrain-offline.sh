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

# The comparison: each step's last update, from the run's train.jsonl and the replay's.
python3 - "$FROM" "$OUT" "${steps[@]}" <<'EOF'
import json, sys
from pathlib import Path

run, replay, steps = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]

def last(path):
    lines = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
    return lines[-1] if lines else {}

def get(row, key):
    value = row.get(key, row.get(f"train/{key}"))
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"

first_run, first_replay = last(run / steps[0] / "train.jsonl"), last(replay / steps[0] / "train.jsonl")
print(f"{'step':<10} {'lr':>8} {'lr':>8}   {'loss':>10} {'loss':>10}   {'entropy':>8} {'entropy':>8}   {'|Δlogp|':>9} {'|Δlogp|':>9}")
print(f"{'':<10} {get(first_run, 'lr'):>8} {get(first_replay, 'lr'):>8}   "
      f"{'run':>10} {'replay':>10}   {'run':>8} {'replay':>8}   {'run':>9} {'replay':>9}")
for name in steps:
    a, b = last(run / name / "train.jsonl"), last(replay / name / "train.jsonl")
    print(f"{name:<10} {'':>8} {'':>8}   {get(a, 'loss'):>10} {get(b, 'loss'):>10}   {get(a, 'entropy'):>8} {get(b, 'entropy'):>8}   "
          f"{get(a, 'mismatch_abs'):>9} {get(b, 'mismatch_abs'):>9}")
print(f"replayed checkpoints: {replay / 'checkpoints'}")
EOF
