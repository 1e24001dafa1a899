#!/usr/bin/env bash
# recipes/harness-table.sh — the harness table: held-out Pass@1 of each trained policy in each
# harness, rows policies, columns evaluation harnesses (the paper's Table 2 in miniature), from the
# runs of recipes/{whitebox,claude-code,codex,mix-harness-smollm2}.toml, and of recipes/openclaw.toml
# with OpenClaw as a column too when RUNS and HARNESSES name it:
#
#     clawgym run recipes/whitebox.toml; clawgym run recipes/claude-code.toml; ...   (the runs)
#     bash recipes/harness-table.sh         # -> recipes/runs/harness-table/table.{md,json,png}
#     RUNS="whitebox claude-code" N=2 bash recipes/harness-table.sh
#     RUNS="whitebox claude-code codex openclaw mix-harness-smollm2" \
#       HARNESSES=agentloop,claude-code,codex,openclaw bash recipes/harness-table.sh
#
# Rows: `base` (SmolLM2-135M-Instruct as the runs start it: the first run's RUN/model-init), then
# for each run `<run>-sft` (its SFT cold start, RUN/checkpoints/sft; SFT=0 leaves these out) and
# `<run>` (its last step checkpoint); BASE=0 leaves the base row out, for a table that adds rows to
# one measured before. Every policy is evaluated in every harness by `clawgym compare`, with the
# recipes' own engine, chat template, slim harness settings and bound on a rollout's calls, on the
# held-out lookup tasks; a cell is Pass@1 ± its standard error over tasks. A rerun resumes the
# rollouts already in OUT; one with more RUNS, HARNESSES or N runs only what it adds. A run named in
# RUNS that has no step checkpoint is an error. DRY_RUN=1 prints the compare command instead of
# running it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

RUNS_DIR="${RUNS_DIR:-$HERE/runs}"                              # where `clawgym run` put the runs
RUNS="${RUNS:-whitebox claude-code codex mix-harness-smollm2}"  # the rows, in order
SFT="${SFT:-1}"                                                 # 1: a row for each run's SFT policy too
BASE="${BASE:-1}"                                               # 1: a row for the base policy first
OUT="${OUT:-$RUNS_DIR/harness-table}"
TASKS="${TASKS:-$HERE/tasks/lookup/heldout}"                    # the recipes' held-out set (48 tasks)
HARNESSES="${HARNESSES:-agentloop,claude-code,codex}"           # the columns
N="${N:-1}"                                                     # samples per task and harness
CONCURRENCY="${CONCURRENCY:-8}"
TIMEOUT="${TIMEOUT:-900}"                                       # seconds per rollout
MAX_CALLS="${MAX_CALLS:-6}"  # codex.toml's and openclaw.toml's bound: a policy that keeps calling there ends at it, not
                             # at TIMEOUT; agentloop and Claude Code end sooner, at their max_turns (0: no bound)
CLAWGYM="${CLAWGYM:-clawgym}"

# the recipes' [engine] and [rollout.<harness>] settings (tests/test_recipes.py checks they agree)
OPTIONS=(--engine hf --chat-template smollm2-tools
         --harness-option agentloop.max_turns=3 --harness-option agentloop.max_tokens=48
         --harness-option 'agentloop.tools=["bash","write"]'
         --harness-option claude-code.bare=true --harness-option claude-code.max_turns=3
         --harness-option claude-code.max_tokens=48
         --harness-option claude-code.tools=Bash,Read,Write,Edit
         --harness-option codex.max_tokens=48 --harness-option codex.idle_timeout_s=1800
         --harness-option codex.context_window=8192 --harness-option codex.slim=true
         --harness-option openclaw.slim=true --harness-option openclaw.max_tokens=48
         --harness-option openclaw.timeout_s=1800)

policies=()
for run in $RUNS; do
  dir="$RUNS_DIR/$run"
  last="$(ls -d "$dir"/checkpoints/step-[0-9]* 2>/dev/null | sort | tail -n 1 || true)"
  if [ -z "$last" ]; then
    echo "error: $dir has no step checkpoint: run \`clawgym run recipes/$run.toml\` first, or leave $run out of RUNS" >&2
    exit 1
  fi
  if [ "$BASE" = 1 ] && [ ${#policies[@]} -eq 0 ]; then
    policies+=(--policy "base=$dir/model-init")
  fi
  if [ "$SFT" = 1 ] && [ -d "$dir/checkpoints/sft" ]; then
    policies+=(--policy "$run-sft=$dir/checkpoints/sft")
  fi
  policies+=(--policy "$run=$last")
done
if [ ${#policies[@]} -eq 0 ]; then
  echo "error: RUNS names no run" >&2
  exit 1
fi

cmd=("$CLAWGYM" compare "${policies[@]}" --tasks "$TASKS" --harness "$HARNESSES" --samples-per-task "$N"
     --concurrency "$CONCURRENCY" --rollout-timeout "$TIMEOUT" --max-calls "$MAX_CALLS" "${OPTIONS[@]}" --out "$OUT")
if [ -n "${DRY_RUN:-}" ]; then  # print the command, one word a line, and run nothing
  printf '%s\n' "${cmd[@]}"
  exit 0
fi
exec "${cmd[@]}"
