#!/usr/bin/env bash
# recipes/pipeline.sh — the RL loop of `clawgym run recipes/toy.toml`, chained from the shell.
#
# `clawgym run` does everything in one process. This script does the same with one command per
# stage, so you can see (and change) each of them:
#
#     serve-proxy (in the background, for the whole run)
#     for each step:  rollout --proxy → build-trees → train → sync
#     then:           eval → inspect
#
# Every stage reads and writes plain files in the run folder, so any of them can be rerun,
# replaced or looked at alone. Each stage's result is kept as JSON (`--json`) beside its files;
# a step is finished when its sync.json exists.
#
# Run it from anywhere (about 8-10 minutes on 2 CPU cores with the defaults):
#
#     bash recipes/pipeline.sh
#
# Rerun it after Ctrl-C, a crash or a reboot and it resumes: finished steps are skipped, and the
# step that was cut short continues from its last complete stage.
#
# The defaults are recipes/toy.toml's: the tiny random policy learns the toy tasks (answer
# with a number). Change any of them from the environment, e.g.
#
#     STEPS=2 N=4 RUN_DIR=/tmp/demo bash recipes/pipeline.sh
#
# recipes/retrain-offline.sh then retrains from this run's saved trees with another learning rate.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# -----------------------------------------------------------------------------------------------
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

# `paths K` sets $dir (step K's rollouts and trees) and $ckpt (the policy it trained). It assigns
# with printf -v rather than $(...): bash 5.2 can misparse its INT trap when Ctrl-C lands inside a
# command substitution, so this script runs none once its traps are set.
paths() {
  printf -v dir '%s/step-%04d' "$RUN_DIR" "$1"
  printf -v ckpt '%s/checkpoints/step-%04d' "$RUN_DIR" "$1"
}

# The harness adapter's options, as [rollout.agentloop] in the recipe.
HARNESS_OPTIONS=(--harness-option "agentloop.max_turns=$MAX_TURNS" --harness-option "agentloop.max_tokens=$MAX_TOKENS")

mkdir -p "$RUN_DIR"

# -----------------------------------------------------------------------------------------------
# Two helpers.
#
# `stage RESULT CMD...` runs one clawgym stage with --json and keeps its result (one JSON object)
# in RESULT. The human output (progress, tables) still reaches the terminal on stderr. The result
# file appears only when the stage succeeded, so a rerun redoes a stage that failed or was cut
# short. The stage runs in the background while the script waits for it: bash runs a trap only
# between commands, and `wait` is one it can interrupt, so Ctrl-C or a SIGTERM is acted on at once.
STAGE_PID=""
stage() {
  local result=$1
  shift
  "$@" --json > "$result.part" &
  STAGE_PID=$!
  wait "$STAGE_PID" || exit $?
  STAGE_PID=""
  mv "$result.part" "$result"
}

# `show LABEL FILE:KEY...` prints figures of the stages' JSON results on one line (KEY may be
# dotted: train.json:last_update.loss), "-" where there is none (a batch with nothing to learn
# makes no update, so no loss).
show() {
  python3 -c 'import json, sys
figures = []
for arg in sys.argv[2:]:
    path, key = arg.rsplit(":", 1)
    v = json.load(open(path))
    for k in key.split("."):
        v = v.get(k) if isinstance(v, dict) else None
    name = key.split(".")[-1]
    figures.append(name + " " + ("-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)))
print(sys.argv[1] + ": " + ", ".join(figures))' "$@" >&2
}

# -----------------------------------------------------------------------------------------------
# 0. The starting policy, and where a rerun resumes.
#
# Without MODEL, the policy is a random tiny Qwen3-architecture model. `clawgym run` makes the
# same one (same seed, same bytes) in RUN/model-init.

if [ -z "$MODEL" ]; then
  MODEL="$RUN_DIR/model-init"
  [ -f "$MODEL/config.json" ] || clawgym init-model "$MODEL" --size tiny --seed 0 --force
fi

# Steps whose sync.json exists are done: the next step starts from the last of their checkpoints.
policy="$MODEL"
first=1
paths "$first"
while [ "$first" -le "$STEPS" ] && [ -f "$dir/sync.json" ]; do
  policy="$ckpt"
  first=$((first + 1))
  paths "$first"
done
if [ "$first" -gt 1 ]; then echo "resuming: steps 1-$((first - 1)) are done; serving $policy" >&2; fi

# -----------------------------------------------------------------------------------------------
# 1. The serving proxy, in the background for the whole run.
#
# Harnesses talk to it as to any model API (Anthropic Messages, OpenAI Chat and Responses); it
# answers with the current policy and records every call's exact tokens and logprobs under
# RUN/records. The admin token lets the stages register rollouts and swap the weights; every
# command reads it from CLAWGYM_ADMIN_TOKEN. A resumed run serves step k's checkpoint as policy
# version k, as if it had never stopped.

export CLAWGYM_ADMIN_TOKEN="${CLAWGYM_ADMIN_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(16))')}"
PROXY_PID=""
PROXY_URL=""

stop_proxy() {
  # Stop what is still running: the stage cut short (SIGTERM stops a clawgym command as Ctrl-C
  # does: its sandboxes closed, finished rollouts kept), then the proxy (it finishes and records
  # the calls in flight, then exits).
  if [ -n "$STAGE_PID" ]; then kill -TERM "$STAGE_PID" 2>/dev/null || true; wait "$STAGE_PID" 2>/dev/null || true; fi
  if [ -n "$PROXY_PID" ]; then kill -TERM "$PROXY_PID" 2>/dev/null || true; wait "$PROXY_PID" 2>/dev/null || true; fi
  STAGE_PID=""
  PROXY_PID=""
}
trap stop_proxy EXIT        # however the script ends
trap 'exit 130' INT         # Ctrl-C: exit, which runs the EXIT trap
trap 'exit 143' TERM        # kill, a CI timeout: the same

if [ "$first" -le "$STEPS" ]; then
  : > "$RUN_DIR/proxy.log"  # there from the start, for the loop below to read
  clawgym serve-proxy --model "$policy" --policy-version $((first - 1)) --port "$PORT" \
    --records "$RUN_DIR/records" > "$RUN_DIR/proxy.log" 2>&1 &
  PROXY_PID=$!
  # It prints "serving MODEL (hf) on URL; ..." once it listens (the model loads first).
  while [ -z "$PROXY_URL" ]; do
    while IFS= read -r line; do
      case "$line" in "serving "*" on http"*) PROXY_URL="${line#*) on }"; PROXY_URL="${PROXY_URL%%;*}" ;; esac
    done < "$RUN_DIR/proxy.log"
    [ -n "$PROXY_URL" ] && break
    if ! kill -0 "$PROXY_PID" 2>/dev/null; then
      echo "error: the proxy did not start; its log:" >&2
      cat "$RUN_DIR/proxy.log" >&2
      exit 1
    fi
    sleep 1
  done
  echo "proxy: $PROXY_URL (log: $RUN_DIR/proxy.log)" >&2
fi

# -----------------------------------------------------------------------------------------------
# 2. The RL steps.

for ((step = first; step <= STEPS; step++)); do
  paths "$step"
  mkdir -p "$dir"
  echo "=== step $step/$STEPS" >&2

  # 2a. collect: N rollouts per task, each harness in its own sandbox, calling the proxy.
  # The verifier scores each final workspace. Writes rollouts.parquet (one row per rollout: status,
  # reward) and calls.parquet (one row per model call: exact token ids and logprobs). A rerun into
  # the same folder keeps the rollouts that finished and redoes the others.
  [ -f "$dir/rollout.json" ] || stage "$dir/rollout.json" \
    clawgym rollout --tasks "$TASKS" --harness "$HARNESS" --n "$N" --concurrency "$CONCURRENCY" \
      --timeout "$TIMEOUT" "${HARNESS_OPTIONS[@]}" --step "$step" \
      --proxy "$PROXY_URL" --records "$RUN_DIR/records" --out "$dir"

  # 2b. reconstruct: each rollout's calls become one prefix tree over token ids, so a prompt
  # shared by several calls is stored (and later computed) once. Writes trees.parquet; the
  # statistics go where `clawgym run` keeps them, so `clawgym inspect` reads both runs alike.
  [ -f "$dir/trees.json" ] || stage "$dir/trees.json" \
    clawgym build-trees "$dir" --max-leaves "$MAX_LEAVES" --metrics "$dir/trees.metrics.jsonl"

  # 2c. optimize: GRPO over the packed trees (advantages normalized within each task's group),
  # from the current policy to a new checkpoint. --resume continues a train call that was cut short.
  [ -f "$dir/train.json" ] || stage "$dir/train.json" \
    clawgym train "$dir" --model "$policy" --out "$ckpt" --algo "$ALGO" --lr "$LR" \
      --seed $((SEED + step)) --resume

  # 2d. sync: the proxy's engine loads the new weights; it returns once they serve, as policy
  # version `step` (recorded on every call from now on).
  stage "$dir/sync.json" clawgym sync --proxy "$PROXY_URL" --checkpoint "$ckpt"
  policy="$ckpt"

  show "step $step" "$dir/rollout.json:mean_reward" "$dir/train.json:last_update.loss" "$dir/sync.json:policy_version"
done

# The steps are done: the proxy is no longer needed.
stop_proxy

# -----------------------------------------------------------------------------------------------
# 3. Evaluate the final policy: Pass@1 per task and category, in eval/step-NNNN/eval.{md,json}
# (where `clawgym run` puts its evaluations). eval serves the checkpoint itself.

paths "$STEPS"
final="$ckpt"
printf -v eval_dir '%s/eval/step-%04d' "$RUN_DIR" "$STEPS"
mkdir -p "$eval_dir"
[ -f "$eval_dir/result.json" ] || stage "$eval_dir/result.json" \
  clawgym eval --tasks "$TASKS" --harness "$HARNESS" --model "$final" --n "$EVAL_N" \
    --concurrency "$CONCURRENCY" --timeout "$TIMEOUT" "${HARNESS_OPTIONS[@]}" --out "$eval_dir"

# -----------------------------------------------------------------------------------------------
# 4. The per-step table of the run: reward, trees, loss, entropy, mismatch, eval Pass@1.

clawgym inspect "$RUN_DIR"
show "done: final policy $final" "$eval_dir/result.json:pass@1"
