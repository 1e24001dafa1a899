#!/usr/bin/env bash
# recipes/pipeline.sh — the RL loop of `clawgym run recipes/toy.toml`, one command per stage:
#
#     serve-proxy (in the background, for the whole run)
#     for each step:  rollout --proxy → build-trees → train → sync
#     then:           eval → inspect
#
# Each stage reads and writes plain files in the run folder and keeps its result as JSON (`--json`)
# beside them; a step is finished when its sync.json exists. Rerun the script after Ctrl-C, a crash
# or a reboot and it resumes: each stage rerun with the same settings continues where it stopped.
#
#     bash recipes/pipeline.sh                          # toy.toml's 8 steps (docs/results.md)
#     STEPS=2 N=4 RUN_DIR=/tmp/demo bash recipes/pipeline.sh
#
# recipes/retrain-offline.sh then retrains from this run's saved trees with another learning rate.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Settings: recipes/toy.toml's, each overridable from the environment.
RUN_DIR="${RUN_DIR:-$HERE/runs/pipeline}"   # everything this run writes
STEPS="${STEPS:-8}"                         # RL steps
SEED="${SEED:-0}"                           # step k trains with seed SEED + k (as `clawgym run`)
MODEL="${MODEL:-}"                          # a starting policy (HF folder); empty: make the tiny one
TASKS="${TASKS:-$HERE/tasks/toy}"           # 8 toy tasks: answer with a number
HARNESS="${HARNESS:-agentloop}"             # the agent program that calls the model
N="${N:-8}"                                 # samples per task: the GRPO group
CONCURRENCY="${CONCURRENCY:-8}"             # rollouts at once
TIMEOUT="${TIMEOUT:-60}"                    # seconds per rollout
MAX_TURNS="${MAX_TURNS:-1}"                 # agentloop: one model call per rollout ...
MAX_TOKENS="${MAX_TOKENS:-8}"               # ... of at most 8 tokens
MAX_LEAVES="${MAX_LEAVES:-64}"              # build-trees drops a more branched rollout
ALGO="${ALGO:-grpo}"
LR="${LR:-0.03}"                            # high, for a random tiny model (docs/recipes.md)
EVAL_N="${EVAL_N:-2}"                       # eval samples per task
PORT="${PORT:-0}"                           # the proxy's port; 0 picks a free one

ROLLOUT_OPTIONS=(--harness "$HARNESS" --concurrency "$CONCURRENCY" --rollout-timeout "$TIMEOUT"
                 --harness-option "agentloop.max_turns=$MAX_TURNS" --harness-option "agentloop.max_tokens=$MAX_TOKENS")
mkdir -p "$RUN_DIR"

# `stage RESULT CMD...` runs a stage with --json; RESULT appears only when it succeeded, so a rerun
# redoes a stage that failed or was cut short. It runs in the background while the script waits:
# bash acts on a trap only between commands, and `wait` is one it interrupts.
STAGE_PID=""
PROXY_PID=""
stage() {
  local result=$1
  shift
  "$@" --json > "$result.part" &
  STAGE_PID=$!
  wait "$STAGE_PID" || exit $?
  STAGE_PID=""
  mv "$result.part" "$result"
}
# Stop what still runs: the stage cut short (SIGTERM stops it as Ctrl-C does, finished work kept),
# then the proxy (it records the calls in flight, then exits).
stop() {
  for pid in $STAGE_PID $PROXY_PID; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  STAGE_PID=""
  PROXY_PID=""
}
# 0. The starting policy (`clawgym run` makes the same bytes in RUN/model-init), and where a rerun
# resumes: steps whose sync.json exists are done.
if [ -z "$MODEL" ]; then
  MODEL="$RUN_DIR/model-init"
  [ -f "$MODEL/config.json" ] || clawgym init-model "$MODEL" --size tiny --seed 0 --force
fi
policy="$MODEL"
first=1
while [ "$first" -le "$STEPS" ] && [ -f "$(printf '%s/step-%04d/sync.json' "$RUN_DIR" "$first")" ]; do
  policy="$(printf '%s/checkpoints/step-%04d' "$RUN_DIR" "$first")"
  first=$((first + 1))
done
if [ "$first" -gt 1 ]; then echo "resuming: steps 1-$((first - 1)) are done; serving $policy" >&2; fi

# 1. The serving proxy for the whole run: harnesses call it as any model API; it answers with the
# current policy and records every call's tokens and logprobs. Step k's checkpoint is served as
# policy version k. It writes proxy.json ({"url": ..., "admin_token": ...}) once it listens.
export CLAWGYM_ADMIN_TOKEN="${CLAWGYM_ADMIN_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(16))')}"
READY="$RUN_DIR/proxy.json"
# From here no $(...): bash 5.2 can misparse its INT trap when Ctrl-C lands inside one.
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ "$first" -le "$STEPS" ]; then
  rm -f "$READY"
  clawgym serve-proxy --model "$policy" --policy-version $((first - 1)) --port "$PORT" \
    --records "$RUN_DIR/records" --ready-file "$READY" > "$RUN_DIR/proxy.log" 2>&1 &
  PROXY_PID=$!
  until [ -s "$READY" ]; do
    kill -0 "$PROXY_PID" 2>/dev/null || { cat "$RUN_DIR/proxy.log" >&2; exit 1; }
    sleep 1
  done
  IFS='"' read -r _ _ _ PROXY_URL _ < "$READY"   # the first field: {"url":"http://HOST:PORT",...}
  echo "proxy: $PROXY_URL (log: $RUN_DIR/proxy.log)" >&2
fi

# 2. The RL steps: collect → reconstruct → optimize → sync.
for ((step = first; step <= STEPS; step++)); do
  printf -v dir '%s/step-%04d' "$RUN_DIR" "$step"
  printf -v ckpt '%s/checkpoints/step-%04d' "$RUN_DIR" "$step"
  mkdir -p "$dir"
  echo "=== step $step/$STEPS" >&2
  # N rollouts per task in sandboxes, scored: rollouts.parquet and calls.parquet (exact tokens).
  [ -f "$dir/rollout.json" ] || stage "$dir/rollout.json" clawgym rollout --tasks "$TASKS" --group-size "$N" \
    "${ROLLOUT_OPTIONS[@]}" --step "$step" --proxy "$PROXY_URL" --records "$RUN_DIR/records" --out "$dir"
  # each rollout's calls as one prefix tree over token ids: trees.parquet
  [ -f "$dir/trees.json" ] || stage "$dir/trees.json" \
    clawgym build-trees "$dir" --max-leaves "$MAX_LEAVES" --metrics "$dir/trees.metrics.jsonl"
  # GRPO over the packed trees, from the current policy to a new checkpoint
  [ -f "$dir/train.json" ] || stage "$dir/train.json" \
    clawgym train "$dir" --model "$policy" --out "$ckpt" --algo "$ALGO" --lr "$LR" --seed $((SEED + step)) --resume
  # the proxy serves the new weights as policy version `step` once this returns
  stage "$dir/sync.json" clawgym sync --proxy "$PROXY_URL" --checkpoint "$ckpt"
  policy="$ckpt"
  python3 -c 'import json, sys; r, s = (json.load(open(f)) for f in sys.argv[1:])
print("step {}: mean reward {:.3f}".format(s["policy_version"], r["mean_reward"]))' "$dir/rollout.json" "$dir/sync.json" >&2
done
stop

# 3. Pass@1 of the final policy per task and category, in eval/step-NNNN/ (where `clawgym run`
# puts it); eval serves the checkpoint itself. 4. The per-step table of the run.
printf -v eval_dir '%s/eval/step-%04d' "$RUN_DIR" "$STEPS"
mkdir -p "$eval_dir"
[ -f "$eval_dir/result.json" ] || stage "$eval_dir/result.json" clawgym eval --tasks "$TASKS" --model "$policy" \
  --samples-per-task "$EVAL_N" "${ROLLOUT_OPTIONS[@]}" --out "$eval_dir"
clawgym inspect "$RUN_DIR"
python3 -c 'import json, sys; print("done: final policy {}, Pass@1 {:.3f}".format(sys.argv[2], json.load(open(sys.argv[1]))["pass@1"]))' \
  "$eval_dir/result.json" "$policy" >&2
